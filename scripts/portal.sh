#!/usr/bin/env bash
# Starts and stops the portal's own processes: the ASGI server (uvicorn), a Celery worker and Celery beat.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
RUN_DIR="$ROOT/var/run"
LOG_DIR="$ROOT/var/log"
VENV="$ROOT/.venv/bin"
HOST="${PORTAL_HOST:-127.0.0.1}"
PORT="${PORTAL_PORT:-8000}"
mkdir -p "$RUN_DIR" "$LOG_DIR" var/static

# name -> command line; each runs in the background with its pid in var/run/<name>.pid.
declare -A COMMANDS=(
  [web]="$VENV/uvicorn portal.asgi:application --host $HOST --port $PORT --workers ${PORTAL_WEB_WORKERS:-2} --no-access-log"
  [worker]="$VENV/celery -A portal worker --loglevel=INFO --concurrency=${CELERY_CONCURRENCY:-2} --hostname=portal@%h"
  [beat]="$VENV/celery -A portal beat --loglevel=INFO --schedule=$ROOT/var/run/celerybeat-schedule"
)
ORDER=(worker beat web)

is_running() {
  local pidfile="$RUN_DIR/$1.pid"
  [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

start_one() {
  local name=$1
  if is_running "$name"; then
    echo "  $name already running (pid $(cat "$RUN_DIR/$name.pid"))"
    return
  fi
  # setsid: the process outlives this script and `make`, and stops as a group.
  setsid ${COMMANDS[$name]} >>"$LOG_DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN_DIR/$name.pid"
  echo "  $name started (pid $!, log var/log/$name.log)"
}

stop_one() {
  local name=$1 pidfile="$RUN_DIR/$1.pid"
  if ! is_running "$name"; then
    rm -f "$pidfile"
    return
  fi
  local pid
  pid=$(cat "$pidfile")
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$pidfile"
  echo "  $name stopped"
}

wait_for_web() {
  for _ in $(seq 1 60); do
    if curl -s -o /dev/null "http://$HOST:$PORT/healthz"; then
      return 0
    fi
    sleep 0.5
  done
  echo "The ASGI server did not answer on http://$HOST:$PORT within 30 s; last lines of var/log/web.log:" >&2
  tail -n 20 "$LOG_DIR/web.log" >&2
  return 1
}

# /healthz answers 200 only when the database, Redis and every registered cluster are ok (as the workers last
# saw them); `make demo` returns only then, so the first page a newcomer opens is not "degraded".
wait_healthy() {
  local body="" deadline=$((SECONDS + ${PORTAL_HEALTH_WAIT_SECS:-120}))
  while ((SECONDS < deadline)); do
    if body=$(curl -sf "http://$HOST:$PORT/healthz"); then
      echo "  healthy: $(summarise_health "$body")"
      return 0
    fi
    body=$(curl -s "http://$HOST:$PORT/healthz" || true)
    sleep 1
  done
  echo "The portal did not report healthy within ${PORTAL_HEALTH_WAIT_SECS:-120} s: $(summarise_health "$body")" >&2
  echo "Its full answer: $body" >&2
  return 1
}

summarise_health() {
  "$VENV/python" -c '
import json, sys
try:
    body = json.loads(sys.argv[1])
except ValueError:
    sys.exit(print("no answer"))
parts = ["database " + body["database"]["status"], "redis " + body["redis"]["status"]]
for cluster in body["clusters"]:
    part = "{} (Slurm {}, API {}) {}".format(
        cluster["name"], cluster.get("slurm_release") or "?", cluster.get("api_version") or "?", cluster["status"]
    )
    parts.append(part + (": " + cluster["error"] if cluster.get("error") else ""))
print(", ".join(parts))
' "$1"
}

case "${1:-}" in
  wait-healthy)
    wait_healthy
    ;;
  up)
    echo "Starting the portal processes"
    for name in "${ORDER[@]}"; do start_one "$name"; done
    wait_for_web
    ;;
  down)
    echo "Stopping the portal processes"
    for name in web beat worker; do stop_one "$name"; done
    ;;
  status)
    for name in "${ORDER[@]}"; do
      if is_running "$name"; then echo "$name: running (pid $(cat "$RUN_DIR/$name.pid"))"; else echo "$name: stopped"; fi
    done
    ;;
  *)
    echo "usage: $0 {up|down|status|wait-healthy}" >&2
    exit 2
    ;;
esac
