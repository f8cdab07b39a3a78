"""Submission rate through the portal's Slurm client versus bare httpx calls to the same slurmrestd, in one run,
on each local cluster (Slurm 22.05, 24.11, 26.05) over the API version the portal negotiates with it.

Both sides submit held jobs (they never run) sequentially over one keep-alive connection with the same
payload; the ratio is the client's overhead (token cache, encoding, error reading, typed decoding).
Usage: python bench/slurm_client.py [--jobs N] [--rounds R] [--cluster NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

from clusters.slurm import SlurmClient
from clusters.slurm.types import JobSubmission
from tests.live_clusters import LiveCluster, live_clusters

ACCOUNT = "benchmark"
USER = "alice"
SETTLE_SECONDS = 3


@dataclass
class Figures:
    cluster: str
    release: str
    api_version: str
    bare_rate: float
    client_rate: float
    bare_p50_ms: float
    client_p50_ms: float
    ratio: float
    ratio_low: float
    ratio_high: float


def submission(cluster: LiveCluster) -> JobSubmission:
    return JobSubmission(
        name="bench",
        account=ACCOUNT,
        partition=cluster.gpu_partition,
        script="#!/bin/bash\necho bench\n",
        time_limit_minutes=1,
        working_directory="/tmp",
        standard_output="/dev/null",
        standard_error="/dev/null",
        gpus=1,
        gpu_type=cluster.gpu_type,
        hold=True,
    )


def through_client(client: SlurmClient, cluster: LiveCluster, count: int) -> tuple[list[int], list[float]]:
    job_ids, latencies = [], []
    for _ in range(count):
        started = time.perf_counter()
        job_ids.append(client.submit_job(user=USER, submission=submission(cluster)).job_id)
        latencies.append(time.perf_counter() - started)
    return job_ids, latencies


def through_bare_httpx(client: SlurmClient, cluster: LiveCluster, count: int) -> tuple[list[int], list[float]]:
    token = client.tokens.mint(USER)
    body = json.dumps(client.codec.encode_submit(submission(cluster)))
    headers = {
        "X-SLURM-USER-NAME": USER,
        "X-SLURM-USER-TOKEN": token,
        "Content-Type": "application/json",
        "Accept": "application/json",  # as the client sends: the same request on the wire
    }
    job_ids, latencies = [], []
    with httpx.Client(base_url=cluster.slurmrestd_url, timeout=10) as bare:
        for _ in range(count):
            started = time.perf_counter()
            response = bare.post(f"{client.codec.slurm_prefix}/job/submit", content=body, headers=headers)
            job_ids.append(response.json()["job_id"])
            latencies.append(time.perf_counter() - started)
    return job_ids, latencies


def cancel_all(client: SlurmClient, job_ids: list[int]) -> None:
    for job_id in job_ids:
        client.cancel_job(user=USER, job_id=job_id)
    # slurmctld and slurmdbd keep working on the cancellations for a while; the next side must not pay for it.
    time.sleep(SETTLE_SECONDS)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure(cluster: LiveCluster, *, jobs: int, rounds: int) -> Figures:
    client = SlurmClient(base_url=cluster.slurmrestd_url, key_file=cluster.jwt_key_file, admin_user=cluster.admin_user)
    if ACCOUNT not in {account.name for account in client.accounts()}:
        client.create_account(name=ACCOUNT, cluster=cluster.name, description="benchmarks", organization="portal")
    client.add_user_association(account=ACCOUNT, user=USER, cluster=cluster.name)

    client_rates: list[float] = []
    bare_rates: list[float] = []
    client_latencies: list[float] = []
    bare_latencies: list[float] = []
    ping = client.ping()
    print(f"{cluster.name}: Slurm {ping.slurm_release}, API v{client.api_version}, {jobs} held jobs per side per round")
    for round_number in range(rounds):
        # Alternate the order so neither side always runs on a warmer (or busier) slurmctld.
        sides = ("client", "bare") if round_number % 2 == 0 else ("bare", "client")
        for side in sides:
            run = through_client if side == "client" else through_bare_httpx
            started = time.perf_counter()
            job_ids, latencies = run(client, cluster, jobs)
            rate = jobs / (time.perf_counter() - started)
            (client_rates if side == "client" else bare_rates).append(rate)
            (client_latencies if side == "client" else bare_latencies).extend(latencies)
            cancel_all(client, job_ids)
        print(
            f"  round {round_number + 1} ({sides[0]} first): bare {bare_rates[-1]:.0f}/s, "
            f"client {client_rates[-1]:.0f}/s, ratio {client_rates[-1] / bare_rates[-1]:.3f}"
        )
    client.close()
    ratios = sorted(c / b for c, b in zip(client_rates, bare_rates, strict=True))
    return Figures(
        cluster=cluster.name,
        release=ping.slurm_release or "?",
        api_version=client.api_version,
        bare_rate=statistics.median(bare_rates),
        client_rate=statistics.median(client_rates),
        bare_p50_ms=percentile(bare_latencies, 0.5) * 1000,
        client_p50_ms=percentile(client_latencies, 0.5) * 1000,
        ratio=statistics.median(ratios),
        ratio_low=ratios[0],
        ratio_high=ratios[-1],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="held jobs per side per round")
    parser.add_argument(
        "--rounds", type=int, default=8, help="rounds; each side goes first in half of them; medians are reported"
    )
    parser.add_argument("--cluster", action="append", help="only this cluster (repeatable); default: every one up")
    args = parser.parse_args()

    clusters = [cluster for cluster in live_clusters() if cluster.status == "up"]
    if args.cluster:
        clusters = [cluster for cluster in clusters if cluster.name in args.cluster]
    if not clusters:
        raise SystemExit("no local cluster is up; start them with `make cluster`")
    figures = [measure(cluster, jobs=args.jobs, rounds=args.rounds) for cluster in clusters]

    print(
        f"\n{'cluster':10}{'Slurm':>10}{'API':>8}{'bare/s':>9}{'client/s':>10}{'bare p50':>10}{'client p50':>12}  ratio"
    )
    for each in figures:
        print(
            f"{each.cluster:10}{each.release:>10}{each.api_version:>8}{each.bare_rate:9.0f}{each.client_rate:10.0f}"
            f"{each.bare_p50_ms:8.2f}ms{each.client_p50_ms:10.2f}ms  {each.ratio:.3f} "
            f"({each.ratio_low:.3f}-{each.ratio_high:.3f})"
        )


if __name__ == "__main__":
    main()
