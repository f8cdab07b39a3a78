#!/usr/bin/env bash
# Starts and stops the portal's own processes: nginx in front, gunicorn (WSGI: pages and the REST API), uvicorn
# (ASGI: WebSockets and log downloads), a Celery worker and Celery beat. Why this split: README, "Processes".
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
RUN_DIR="$ROOT/var/run"
LOG_DIR="$ROOT/var/log"
VENV="$ROOT/.venv/bin"
HOST="${PORTAL_HOST:-127.0.0.1}"
PORT="${PORTAL_PORT:-8000}"
CORES=$(nproc)
# gunicorn: PORTAL_WEB_WORKERS processes (default 2 per core + 1: while one waits on PostgreSQL another computes)
# of PORTAL_WEB_THREADS threads each (1: sync workers; more: gthread workers); each thread keeps one PostgreSQL
# connection open (DATABASE_CONN_MAX_AGE below). uvicorn: PORTAL_ASGI_WORKERS processes. README, "Processes".
WEB_WORKERS="${PORTAL_WEB_WORKERS:-$((2 * CORES + 1))}"
WEB_THREADS="${PORTAL_WEB_THREADS:-1}"
ASGI_WORKERS="${PORTAL_ASGI_WORKERS:-1}"
WSGI_CONN_MAX_AGE="${DATABASE_CONN_MAX_AGE:-60}"
ASGI_POOL_SIZE="${PORTAL_ASGI_DB_POOL:-4}"
WSGI_SOCKET="$RUN_DIR/wsgi.sock"
ASGI_SOCKET="$RUN_DIR/asgi.sock"
NGINX_CONF="$RUN_DIR/nginx/nginx.conf"
# Every portal process of this host writes its metrics here (prometheus_client's multiprocess mode), and a scrape of
# /metrics on any web process sums them all: README, "Metrics and alerts". Emptied when the portal starts afresh.
export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-$RUN_DIR/metrics}"
# /metrics wants this token as well as a loopback address (PORTAL_METRICS_ALLOW); the demo's Prometheus
# (scripts/prometheus.sh) reads the same file. A token of the site's own: set PORTAL_METRICS_TOKEN(_FILE).
if [[ -z "${PORTAL_METRICS_TOKEN:-}${PORTAL_METRICS_TOKEN_FILE:-}" ]]; then
  export PORTAL_METRICS_TOKEN_FILE="$ROOT/var/metrics_token"
fi
# The servers' own log lines in the portal's format (PORTAL_LOG_FORMAT, portal/logs.py), as their Django and Celery
# lines are; written by `up`.
LOG_CONFIG="$RUN_DIR/logging.json"
mkdir -p "$RUN_DIR/nginx" "$LOG_DIR" var/static "$PROMETHEUS_MULTIPROC_DIR"

if ((WEB_THREADS > 1)); then WORKER_CLASS="--worker-class=gthread --threads=$WEB_THREADS"; else WORKER_CLASS=""; fi

# name -> command line; each runs in the background with its pid in var/run/<name>.pid. Behind nginx the rate
# limits read the client's address from X-Forwarded-For (PORTAL_NUM_PROXIES=1). Under uvicorn a database
# connection kept for reuse outlives its request's thread (portal/env.py), so only gunicorn keeps them; uvicorn
# returns its connections to a pool of PORTAL_ASGI_DB_POOL per process (a WebSocket handshake opens none).
# Logs: nginx's access log has a line per request with its id; the others log at PORTAL_LOG_LEVEL (Celery's
# --quiet leaves out its start-up banner, which is not a log line).
declare -A COMMANDS=(
  [nginx]="/usr/sbin/nginx -c $NGINX_CONF -e $LOG_DIR/nginx.log"
  [wsgi]="env PORTAL_NUM_PROXIES=${PORTAL_NUM_PROXIES:-1} DATABASE_CONN_MAX_AGE=$WSGI_CONN_MAX_AGE $VENV/gunicorn portal.wsgi:application -c python:portal.gunicorn_conf --bind unix:$WSGI_SOCKET --workers $WEB_WORKERS $WORKER_CLASS --timeout 60 --log-config-json $LOG_CONFIG"
  [asgi]="env PORTAL_NUM_PROXIES=${PORTAL_NUM_PROXIES:-1} DATABASE_CONN_MAX_AGE=0 DATABASE_POOL_SIZE=$ASGI_POOL_SIZE $VENV/uvicorn portal.asgi:application --uds $ASGI_SOCKET --workers $ASGI_WORKERS --no-access-log --log-config $LOG_CONFIG"
  [worker]="$VENV/celery -A portal --quiet worker --concurrency=${CELERY_CONCURRENCY:-2} --hostname=portal@%h"
  [beat]="$VENV/celery -A portal --quiet beat --schedule=$ROOT/var/run/celerybeat-schedule"
)
ORDER=(worker beat asgi wsgi nginx)

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
  # A server that was killed leaves its socket behind, and uvicorn will not bind over it.
  case $name in
    asgi) rm -f "$ASGI_SOCKET" ;;
    wsgi) rm -f "$WSGI_SOCKET" ;;
  esac
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

# A random token for /metrics, readable by its owner only, made once per checkout (as var/secret_key is).
metrics_token_prepare() {
  local file=${PORTAL_METRICS_TOKEN_FILE:-}
  [[ -n $file && ! -s $file ]] || return 0
  (umask 077 && "$VENV/python" -c 'import secrets; print(secrets.token_urlsafe(32))' > "$file")
}

# The metrics files of processes that are gone: counters that would otherwise add to the new processes' own.
metrics_files_clear() {
  local name
  for name in "${ORDER[@]}"; do
    if is_running "$name"; then return 0; fi
  done
  rm -f "$PROMETHEUS_MULTIPROC_DIR"/*.db
}

# nginx from Debian (scripts/services.sh installs it when missing); its configuration is
# deploy/nginx.conf.template filled in for this checkout. nginx's workers run as the user running this script, as
# the portal's other processes do: they reach the sockets and static files wherever the checkout lives.
nginx_prepare() {
  [[ -x /usr/sbin/nginx ]] || bash scripts/services.sh nginx
  local user
  user=$(id -un)
  sed -e "s|@@LISTEN@@|$HOST:$PORT|" \
    -e "s|@@WSGI_SERVERS@@|server unix:$WSGI_SOCKET fail_timeout=0;|" \
    -e "s|@@ASGI_SERVERS@@|server unix:$ASGI_SOCKET fail_timeout=0;|" \
    -e "s|@@STATIC_ROOT@@|$ROOT/var/static|" \
    -e "s|@@STATE_DIR@@|$RUN_DIR/nginx|g" \
    -e "s|@@ACCESS_LOG@@|$LOG_DIR/nginx-access.log portal_json|" \
    -e "s|@@ERROR_LOG@@|$LOG_DIR/nginx.log|" \
    -e "s|@@WORKER_PROCESSES@@|1|" \
    -e "s|@@USER@@|$user|" \
    deploy/nginx.conf.template > "$NGINX_CONF"
  if grep -q '@@[A-Z_]*@@' "$NGINX_CONF"; then
    echo "deploy/nginx.conf.template has placeholders this script does not fill in:" >&2
    grep -o '@@[A-Z_]*@@' "$NGINX_CONF" | sort -u >&2
    return 1
  fi
  /usr/sbin/nginx -t -q -c "$NGINX_CONF" -e "$LOG_DIR/nginx.log"
  # nginx serves /static/ from the collected files.
  "$VENV/python" manage.py collectstatic --noinput -v0
}

# Each server at its own address: nginx's answer alone would not show that uvicorn behind it is up.
wait_for_web() {
  local name url socket
  for name in asgi wsgi nginx; do
    case $name in
      asgi) socket=$ASGI_SOCKET url=http://localhost/healthz ;;
      wsgi) socket=$WSGI_SOCKET url=http://localhost/healthz ;;
      nginx) socket="" url="http://$HOST:$PORT/healthz" ;;
    esac
    for _ in $(seq 1 60); do
      if curl -s -o /dev/null ${socket:+--unix-socket "$socket"} "$url"; then
        continue 2
      fi
      sleep 0.5
    done
    echo "$name did not answer at ${socket:-$url} within 30 s; last lines of var/log/$name.log:" >&2
    tail -n 20 "$LOG_DIR/$name.log" >&2
    return 1
  done
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
    echo "Starting the portal processes: gunicorn x $WEB_WORKERS (threads $WEB_THREADS), uvicorn x $ASGI_WORKERS," \
      "Celery worker x ${CELERY_CONCURRENCY:-2}, beat, nginx on http://$HOST:$PORT/"
    nginx_prepare
    metrics_token_prepare
    metrics_files_clear
    "$VENV/python" -m portal.logs > "$LOG_CONFIG"
    for name in "${ORDER[@]}"; do start_one "$name"; done
    wait_for_web
    ;;
  down)
    echo "Stopping the portal processes"
    # web: the uvicorn that served everything before nginx and gunicorn came in, started by an older checkout.
    for name in nginx wsgi asgi web beat worker; do stop_one "$name"; done
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
