#!/usr/bin/env bash
# Prometheus for the demo, and promtool for the checks of the alerting rules: prometheus.sh {install|check|up|down|status}
#   install  Debian's prometheus package (prometheus and promtool), if missing; starts no system service
#   check    promtool: the scrape configuration, the alerting rules and their unit tests (make lint, so make test)
#   up       its own Prometheus on PROMETHEUS_LISTEN (127.0.0.1:9090) scraping the portal at PORTAL_HOST:PORTAL_PORT
#            with the project's alerting rules, data under var/prometheus, log var/log/prometheus.log; and the DCGM
#            replay exporter (scripts/dcgm_replay.py) on DCGM_REPLAY_LISTEN (127.0.0.1:9400) for the local clusters'
#            fake-GPU nodes, which it scrapes too (log var/log/dcgm-replay.log)
#   down     stops the Prometheus and the exporter `up` started
# Configuration: deploy/prometheus/ (README, "Metrics and alerts").
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
RUN_DIR="$ROOT/var/run/prometheus"
LOG_DIR="$ROOT/var/log"
DATA_DIR="$ROOT/var/prometheus"
PID_FILE="$RUN_DIR/prometheus.pid"
CONFIG="$RUN_DIR/prometheus.yml"
LISTEN="${PROMETHEUS_LISTEN:-127.0.0.1:9090}"
PORTAL="${PORTAL_HOST:-127.0.0.1}:${PORTAL_PORT:-8000}"
RULES="$ROOT/deploy/prometheus/alerts.yml"
RULE_TESTS="$ROOT/deploy/prometheus/alerts_test.yml"
DCGM_LISTEN="${DCGM_REPLAY_LISTEN:-127.0.0.1:9400}"
DCGM_PID_FILE="$RUN_DIR/dcgm-replay.pid"
CLUSTERS_DIR="${DEMO_CLUSTER_REGISTRY:-/var/lib/gpuportal/clusters}"

log() { printf '[prometheus] %s\n' "$*"; }
die() { printf '[prometheus] ERROR: %s\n' "$*" >&2; exit 1; }

installed() { [[ -x /usr/bin/prometheus && -x /usr/bin/promtool ]]; }

# Debian's own package (2.42 on Debian 12), without the node exporter it recommends. Where no policy-rc.d says
# otherwise, its postinst would start the system service on port 9090: one is put in place for the install only,
# so the only Prometheus running is the one `up` starts, with the project's configuration.
install_prometheus() {
  installed && return 0
  [[ $(id -u) -eq 0 ]] || die "must run as root to install Debian's prometheus package (or install it yourself)"
  local policy=/usr/sbin/policy-rc.d ours=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    ours=1
  fi
  log "installing Debian's prometheus package"
  local status=0
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } || status=$?
  ((ours == 0)) || rm -f "$policy"
  ((status == 0)) || die "apt-get could not install prometheus (exit $status)"
  installed || die "the prometheus package is installed but /usr/bin/prometheus or /usr/bin/promtool is missing"
}

# The token the portal wants on /metrics (scripts/portal.sh makes var/metrics_token unless the site set its own).
token_file() {
  if [[ -n ${PORTAL_METRICS_TOKEN:-} ]]; then
    (umask 077 && printf '%s\n' "$PORTAL_METRICS_TOKEN" > "$RUN_DIR/metrics_token")
    echo "$RUN_DIR/metrics_token"
  else
    echo "${PORTAL_METRICS_TOKEN_FILE:-$ROOT/var/metrics_token}"
  fi
}

render_config() {
  mkdir -p "$RUN_DIR" "$LOG_DIR" "$DATA_DIR"
  local token
  token=$(token_file)
  [[ -f $token ]] || (umask 077 && : > "$token")  # for `check` before the portal ever ran
  sed -e "s|@@PORTAL@@|$PORTAL|" -e "s|@@SELF@@|$LISTEN|" -e "s|@@RULES@@|$RULES|" -e "s|@@TOKEN_FILE@@|$token|" \
    -e "s|@@DCGM@@|$DCGM_LISTEN|" \
    deploy/prometheus/prometheus.yml.template > "$CONFIG"
  if grep -q '@@[A-Z_]*@@' "$CONFIG"; then
    die "deploy/prometheus/prometheus.yml.template has placeholders this script does not fill in"
  fi
}

check() {
  install_prometheus
  render_config
  promtool check config --syntax-only "$CONFIG" >/dev/null
  promtool check rules "$RULES"
  promtool test rules "$RULE_TESTS"
}

is_running() { [[ -f $PID_FILE ]] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; }

exporter_running() { [[ -f $DCGM_PID_FILE ]] && kill -0 "$(cat "$DCGM_PID_FILE")" 2>/dev/null; }

# answers URL CHECK: waits (at most 30 s) until URL answers; fails as soon as the command CHECK says the process died.
answers() {
  local url=$1 check=$2
  for _ in $(seq 1 60); do
    curl -sf "$url" >/dev/null && return 0
    $check || return 1
    sleep 0.5
  done
  return 1
}

# The stand-in for NVIDIA's DCGM exporter: real H100 readings replayed on the fake-GPU nodes of the clusters that
# scripts/cluster.sh described as up (README, "Fake GPUs, and what was checked on a real one").
exporter_up() {
  if exporter_running; then
    return 0
  fi
  setsid "$ROOT/.venv/bin/python" "$ROOT/scripts/dcgm_replay.py" --listen "$DCGM_LISTEN" --clusters-dir "$CLUSTERS_DIR" \
    --gpus-per-node 8 \
    >>"$LOG_DIR/dcgm-replay.log" 2>&1 </dev/null &
  echo $! > "$DCGM_PID_FILE"
  if answers "http://$DCGM_LISTEN/metrics" exporter_running; then
    log "DCGM replay exporter (pid $(cat "$DCGM_PID_FILE")) on http://$DCGM_LISTEN/metrics; log var/log/dcgm-replay.log"
    return 0
  fi
  tail -n 20 "$LOG_DIR/dcgm-replay.log" >&2
  die "the DCGM replay exporter did not answer on $DCGM_LISTEN"
}

exporter_down() {
  if exporter_running; then
    kill -TERM "$(cat "$DCGM_PID_FILE")" || true
  fi
  rm -f "$DCGM_PID_FILE"
}

up() {
  install_prometheus
  render_config
  exporter_up
  promtool check config "$CONFIG" >/dev/null
  if is_running; then
    kill -HUP "$(cat "$PID_FILE")"  # reads the configuration and the rules again
    log "already running (pid $(cat "$PID_FILE")); configuration reloaded"
    return 0
  fi
  setsid /usr/bin/prometheus --config.file="$CONFIG" --storage.tsdb.path="$DATA_DIR" \
    --storage.tsdb.retention.time=15d --web.listen-address="$LISTEN" \
    >>"$LOG_DIR/prometheus.log" 2>&1 </dev/null &
  echo $! > "$PID_FILE"
  if answers "http://$LISTEN/-/ready" is_running; then
    log "started (pid $(cat "$PID_FILE")) on http://$LISTEN/, scraping http://$PORTAL/metrics; log var/log/prometheus.log"
    return 0
  fi
  tail -n 20 "$LOG_DIR/prometheus.log" >&2
  die "Prometheus did not become ready on $LISTEN"
}

down() {
  exporter_down
  if ! is_running; then
    rm -f "$PID_FILE"
    return 0
  fi
  local pid
  pid=$(cat "$PID_FILE")
  kill -TERM "$pid"
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PID_FILE"
  log "stopped"
}

case "${1:-}" in
  install) install_prometheus ;;
  check) check ;;
  up) up ;;
  down) down ;;
  status)
    if is_running; then echo "prometheus: running (pid $(cat "$PID_FILE")) on http://$LISTEN/"; else echo "prometheus: stopped"; fi
    if exporter_running; then echo "dcgm replay: running on http://$DCGM_LISTEN/metrics"; else echo "dcgm replay: stopped"; fi ;;
  *) echo "usage: $0 {install|check|up|down|status}" >&2; exit 2 ;;
esac
