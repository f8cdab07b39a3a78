"""`make drills`: run the fault drills on the real local stack, each in a process of its own, and say which passed.

Usage: python scripts/drills/run.py [name ...]   (no names: all of them, in the order below)

Each drill prints what it did (a timeline) and what its ledger check found, then PASS or FAIL; this exits
non-zero when any drill failed. Drills stop and start the local cluster's daemons: run them when nothing else
uses the cluster. Whatever happens, the cluster is brought back (`scripts/cluster.sh up`) after each drill.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# Every drill, in the order `make drills` runs them; each is scripts/drills/drill_<name>.py.
DRILLS = ["slurmrestd", "worker", "redis", "slurmctld", "node_down", "websocket", "restore", "restore_burst", "hosts"]
# A drill takes a few minutes; one that hangs past this is stopped and counted as failed.
DRILL_TIMEOUT_SECONDS = 15 * 60


def drill_path(name: str) -> Path:
    return HERE / f"drill_{name}.py"


def drill_run(name: str) -> str:
    """Run one drill in its own process; its verdict: PASS, FAIL, or TIMEOUT."""
    started = time.monotonic()
    try:
        command = [sys.executable, str(drill_path(name))]
        finished = subprocess.run(command, cwd=ROOT, timeout=DRILL_TIMEOUT_SECONDS)  # noqa: S603 -- our own drills
        verdict = "PASS" if finished.returncode == 0 else "FAIL"
    except subprocess.TimeoutExpired:
        verdict = "TIMEOUT"
    finally:
        # A drill that crashed or hung may have left a daemon stopped; the next drill needs the whole cluster.
        restore = ["bash", str(ROOT / "scripts" / "cluster.sh"), "up"]
        subprocess.run(restore, cwd=ROOT, stdout=subprocess.DEVNULL)  # noqa: S603 -- the project's own script
    print(f"--- {name}: {verdict} in {time.monotonic() - started:.0f} s\n", flush=True)
    return verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="name", help=f"drills to run (default: all): {', '.join(DRILLS)}")
    names = parser.parse_args().names or DRILLS
    if unknown := [name for name in names if name not in DRILLS]:
        parser.error(f"no drill named {', '.join(unknown)}; choose from {', '.join(DRILLS)}")
    verdicts: dict[str, str] = {}
    for name in names:
        if not drill_path(name).exists():
            print(f"--- {name}: MISSING ({drill_path(name).relative_to(ROOT)} is not written yet)\n", flush=True)
            verdicts[name] = "MISSING"
            continue
        verdicts[name] = drill_run(name)
    print("drills: " + ", ".join(f"{name} {verdict}" for name, verdict in verdicts.items()))
    # A drill not written yet is reported, not failed: the others still prove what they prove.
    sys.exit(0 if all(verdict in ("PASS", "MISSING") for verdict in verdicts.values()) else 1)


if __name__ == "__main__":
    main()
