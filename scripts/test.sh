#!/usr/bin/env bash
# The whole suite as three pytest processes side by side (`make test`): the browser and page tests
# (tests/frontend), the jobs and clusters tests (most of the live-cluster journeys), and the rest. Most of the
# suite waits on Slurm, the browser and the servers it starts (split in two processes it still used only a quarter
# of the two cores), so the others fill its idle CPU. Each process has its own test database and its own Redis
# databases (tests/settings.py; 1-6 and 13-15: the demo has 0, the load test 4-6, the drills 7-9 and the
# benchmarks 10-12, none of which runs beside the tests), so they share nothing but the live clusters, where every
# test makes its own accounts and jobs, and their requests to slurmdbd take turns (tests/slurmdb_lock.py). The few
# tests that stop or freeze a cluster's daemons (marked `disrupts_clusters`) would break the other processes'
# tests, so they run afterwards, alone. Each shard's output is prefixed with its name; the run fails when any part
# fails.
#
# Arguments go to pytest. With a path among them (`make test PYTEST_ARGS=tests/jobs`), or with TEST_SHARDS=1,
# one pytest runs as before.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

shard_count=${TEST_SHARDS:-3} # only 1 (one pytest) or the three below
for arg in "$@"; do
    [[ $arg == tests* ]] && shard_count=1
done
if [[ $shard_count == 1 ]]; then
    exec "$PY" -m pytest "$@"
fi

database=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/gpuportal}
# name, Redis databases, database URL, then pytest's own arguments
shards=(
    "frontend|13,14,15|$database|tests/frontend"
    "jobs|1,2,3|${database}_jobs|tests/jobs tests/clusters"
    "rest|4,5,6|${database}_rest|tests/billing tests/portal tests/quotas tests/tenants"
)
# Every test directory belongs to one shard: a new one must be added above.
for directory in tests/*/; do
    directory=${directory%/}
    compgen -G "$directory/test_*.py" >/dev/null || continue
    if ! printf '%s\n' "${shards[@]}" | cut -d'|' -f4 | tr ' ' '\n' | grep -qx "$directory"; then
        echo "scripts/test.sh: $directory is in no shard; add it to one" >&2
        exit 2
    fi
done

pids=()
names=()
for shard in "${shards[@]}"; do
    IFS='|' read -r name redis_dbs url paths <<<"$shard"
    # shellcheck disable=SC2086  # the shard's paths are words
    (
        TEST_REDIS_DBS=$redis_dbs DATABASE_URL=$url "$PY" -m pytest -m "not disrupts_clusters" "$@" $paths 2>&1 |
            sed -u "s/^/[$name] /"
    ) &
    pids+=("$!")
    names+=("$name")
done

status=0
for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
        echo "[${names[$i]}] FAILED" >&2
        status=1
    fi
done
echo "[disrupts] the tests that stop or freeze a cluster's daemons, alone"
"$PY" -m pytest -m disrupts_clusters "$@" tests/jobs tests/clusters 2>&1 | sed -u "s/^/[disrupts] /" || status=1
exit "$status"
