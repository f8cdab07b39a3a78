"""The local Slurm clusters `scripts/cluster.sh up` started, as it describes them in /var/lib/gpuportal/clusters/.

One file per cluster: the 22.05 one on the host ("local") and the newer generations in chroots ("north", "south").
Tests that must hold on every Slurm generation are parametrised over `live_cluster_params()`; a cluster that
could not be built on this machine is skipped with the reason `cluster.sh` recorded, never silently.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.slurmdb_lock import slurmdbd_turn

REGISTRY_DIR = Path(os.environ.get("GPUPORTAL_CLUSTER_REGISTRY", "/var/lib/gpuportal/clusters"))
# The order the suite runs them in: oldest generation first.
KNOWN_CLUSTERS = ("local", "north", "south")


@dataclass(frozen=True)
class LiveCluster:
    name: str  # the portal's name for it, and Slurm's ClusterName
    status: str  # "up" or "unavailable"
    reason: str
    slurm_release: str  # "24.11.5", read from the daemons at `up`
    slurmrestd_url: str
    jwt_key_file: str
    admin_user: str
    log_root: str
    gpu_type: str  # a GPU type of this cluster (each newer cluster has one the others lack)
    gpu_partition: str
    gpus_per_node: int
    chroot: str  # "" for the host's cluster
    # Its network as topology.conf describes it: leaf switch -> nodes ({} for a cluster started before it had one).
    switches: dict[str, list[str]] = field(default_factory=dict)

    def switch_of(self, node: str) -> str:
        return next((switch for switch, nodes in self.switches.items() if node in nodes), "")

    @property
    def label(self) -> str:
        return f"{self.name}-{self.slurm_release or 'unavailable'}"

    @property
    def generation(self) -> tuple[int, int]:
        major, minor, *_ = (self.slurm_release or "0.0").split(".")
        return int(major), int(minor)

    def slurm_command(self, *args: str) -> str:
        """Run a Slurm command (sacctmgr, scontrol) on this cluster as root, as its admin would; its output."""
        command = ["chroot", self.chroot, *args] if self.chroot else list(args)
        with slurmdbd_turn() if args[0] == "sacctmgr" else contextlib.nullcontext():
            completed = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        if completed.returncode != 0:
            raise AssertionError(f"{' '.join(command)} failed: {completed.stderr or completed.stdout}")
        return completed.stdout


def _load(path: Path) -> LiveCluster:
    raw: dict[str, Any] = json.loads(path.read_text())
    return LiveCluster(
        name=raw["name"],
        status=raw["status"],
        reason=raw.get("reason", ""),
        slurm_release=raw.get("slurm_release", ""),
        slurmrestd_url=raw["slurmrestd_url"],
        jwt_key_file=raw["jwt_key_file"],
        admin_user=raw.get("admin_user", "root"),
        log_root=raw["log_root"],
        gpu_type=raw["gpu_type"],
        gpu_partition=raw["gpu_partition"],
        gpus_per_node=int(raw["gpus_per_node"]),
        chroot=raw.get("chroot", ""),
        switches={str(switch): list(nodes) for switch, nodes in (raw.get("switches") or {}).items()},
    )


def live_clusters() -> list[LiveCluster]:
    found = {path.stem: _load(path) for path in REGISTRY_DIR.glob("*.json")}
    return [found[name] for name in KNOWN_CLUSTERS if name in found]


def live_cluster_params() -> list[Any]:
    """pytest params, one per cluster `cluster.sh` described; unavailable ones are skipped with their reason."""
    clusters = live_clusters()
    if not clusters:
        # Collected before any cluster was started: the fixtures fail with the way out.
        return [pytest.param(None, id="no-cluster")]
    return [
        pytest.param(
            cluster,
            id=cluster.name,
            marks=[pytest.mark.skip(reason=f"cluster {cluster.name}: {cluster.reason}")]
            if cluster.status != "up"
            else [],
        )
        for cluster in clusters
    ]
