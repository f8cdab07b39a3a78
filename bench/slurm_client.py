"""Submission rate through the portal's Slurm client versus bare httpx calls to the same slurmrestd, in one run.

Both sides submit held jobs (they never run) sequentially over one keep-alive connection with the same
payload; the ratio is the client's overhead (token cache, encoding, error reading, typed decoding).
Usage: python bench/slurm_client.py [--jobs N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

from django.conf import settings

from jobs.slurm import SlurmClient
from jobs.slurm.types import JobSubmission

ACCOUNT = "benchmark"
USER = "alice"
CLUSTER = "local"
SETTLE_SECONDS = 3


def submission() -> JobSubmission:
    return JobSubmission(
        name="bench",
        account=ACCOUNT,
        partition="h100",
        script="#!/bin/bash\necho bench\n",
        time_limit_minutes=1,
        working_directory="/tmp",
        standard_output="/dev/null",
        standard_error="/dev/null",
        gpus=1,
        gpu_type="h100",
        hold=True,
    )


def through_client(client: SlurmClient, count: int) -> tuple[list[int], list[float]]:
    job_ids, latencies = [], []
    for _ in range(count):
        started = time.perf_counter()
        job_ids.append(client.submit_job(user=USER, submission=submission()).job_id)
        latencies.append(time.perf_counter() - started)
    return job_ids, latencies


def through_bare_httpx(client: SlurmClient, count: int) -> tuple[list[int], list[float]]:
    token = client.tokens.mint(USER)
    body = json.dumps(client.codec.encode_submit(submission()))
    headers = {
        "X-SLURM-USER-NAME": USER,
        "X-SLURM-USER-TOKEN": token,
        "Content-Type": "application/json",
        "Accept": "application/json",  # as the client sends: the same request on the wire
    }
    job_ids, latencies = [], []
    with httpx.Client(base_url=settings.LOCAL_CLUSTER_URL, timeout=10) as bare:
        for _ in range(count):
            started = time.perf_counter()
            response = bare.post("/slurm/v0.0.38/job/submit", content=body, headers=headers)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="held jobs per side per round")
    parser.add_argument(
        "--rounds", type=int, default=8, help="rounds; each side goes first in half of them; medians are reported"
    )
    args = parser.parse_args()

    client = SlurmClient(
        base_url=settings.LOCAL_CLUSTER_URL, key_file=settings.LOCAL_CLUSTER_KEY_FILE, api_version="0.0.38"
    )
    if ACCOUNT not in {account.name for account in client.accounts()}:
        client.create_account(name=ACCOUNT, cluster=CLUSTER, description="benchmarks", organization="portal")
    client.add_user_association(account=ACCOUNT, user=USER, cluster=CLUSTER)

    client_rates: list[float] = []
    bare_rates: list[float] = []
    client_latencies: list[float] = []
    bare_latencies: list[float] = []
    print(
        f"slurmrestd {client.ping().slurm_release}, API v{client.api_version}, {args.jobs} held jobs per side per round"
    )
    for round_number in range(args.rounds):
        # Alternate the order so neither side always runs on a warmer (or busier) slurmctld.
        sides = ("client", "bare") if round_number % 2 == 0 else ("bare", "client")
        for side in sides:
            run = through_client if side == "client" else through_bare_httpx
            started = time.perf_counter()
            job_ids, latencies = run(client, args.jobs)
            rate = args.jobs / (time.perf_counter() - started)
            (client_rates if side == "client" else bare_rates).append(rate)
            (client_latencies if side == "client" else bare_latencies).extend(latencies)
            cancel_all(client, job_ids)
        print(
            f"  round {round_number + 1} ({sides[0]} first): bare {bare_rates[-1]:.0f}/s, "
            f"client {client_rates[-1]:.0f}/s, ratio {client_rates[-1] / bare_rates[-1]:.3f}"
        )

    ratios = sorted(c / b for c, b in zip(client_rates, bare_rates, strict=True))
    print(f"{'':24}{'jobs/s':>10}{'p50 ms':>10}{'p95 ms':>10}   (median round)")
    for label, rates, latencies in (
        ("bare httpx", bare_rates, bare_latencies),
        ("portal SlurmClient", client_rates, client_latencies),
    ):
        p50, p95 = percentile(latencies, 0.50) * 1000, percentile(latencies, 0.95) * 1000
        print(f"{label:24}{statistics.median(rates):10.1f}{p50:10.2f}{p95:10.2f}")
    print(
        f"ratio client/bare (median of paired rounds): {statistics.median(ratios):.3f}  "
        f"(range {ratios[0]:.3f}-{ratios[-1]:.3f})"
    )
    client.close()


if __name__ == "__main__":
    main()
