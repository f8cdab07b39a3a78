#!/usr/bin/env bash
# The demo's OpenID provider (scripts/oidc/provider.mjs: the certified `oidc-provider` package from npm) on
# OIDC_PROVIDER_HOST:OIDC_PROVIDER_PORT (127.0.0.1:8300), with the portal at PORTAL_BASE_URL as its client, a
# machine identity `ci-pipeline` (client credentials, same secret) and JWT access tokens for PORTAL_BASE_URL/api.
#   install   npm ci from scripts/oidc/package-lock.json (make test needs it too)
#   up        install, then start it (log var/log/oidc.log) and wait until it answers
#   down      stop it
#   providers print the PORTAL_OIDC_PROVIDERS that points the portal at it (the Makefile's demo uses it)
# The client secret is this checkout's own, made on the first `up` in var/oidc/client_secret (owner-only).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
HOST="${OIDC_PROVIDER_HOST:-127.0.0.1}"
PORT="${OIDC_PROVIDER_PORT:-8300}"
PORTAL="${PORTAL_BASE_URL:-http://127.0.0.1:8000}"
PORTAL="${PORTAL%/}"
SECRET_FILE="$ROOT/var/oidc/client_secret"
PIDFILE="$ROOT/var/run/oidc.pid"
LOG="$ROOT/var/log/oidc.log"

is_running() {
  [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

# The portal reads the secret from the file as soon as PORTAL_OIDC_PROVIDERS names it (the demo's first steps,
# before the provider starts), so `providers` makes it too.
secret_ensure() {
  mkdir -p var/oidc
  if [[ ! -s "$SECRET_FILE" ]]; then
    (umask 077 && head -c 32 /dev/urandom | base64 | tr -d '/+=\n' > "$SECRET_FILE")
  fi
}

up() {
  bash scripts/npm-ci.sh scripts/oidc
  mkdir -p var/run var/log
  secret_ensure
  if is_running; then
    echo "  OpenID provider already running (pid $(cat "$PIDFILE"))"
    return
  fi
  local clients
  clients=$(SECRET="$(cat "$SECRET_FILE")" PORTAL="$PORTAL" python3 -c '
import json, os
portal = os.environ["PORTAL"]
print(json.dumps([{
    "client_id": "gpuportal",
    "client_secret": os.environ["SECRET"],
    "redirect_uris": [portal + "/oidc/demo/login/callback/"],
    "post_logout_redirect_uris": [portal + "/login/"],
}, {
    "client_id": "ci-pipeline",
    "client_secret": os.environ["SECRET"],
    "redirect_uris": [],
    "grant_types": ["client_credentials"],
}]))')
  OIDC_PROVIDER_HOST=$HOST OIDC_PROVIDER_PORT=$PORT OIDC_CLIENTS=$clients OIDC_API_RESOURCES="[\"$PORTAL/api\"]" \
    setsid node scripts/oidc/provider.mjs >>"$LOG" 2>&1 </dev/null &
  echo $! > "$PIDFILE"
  for _ in $(seq 1 60); do
    if curl -sf -o /dev/null "http://$HOST:$PORT/.well-known/openid-configuration"; then
      echo "  OpenID provider started on http://$HOST:$PORT (pid $(cat "$PIDFILE"), log var/log/oidc.log)"
      return
    fi
    is_running || break
    sleep 0.5
  done
  echo "The OpenID provider did not answer on http://$HOST:$PORT; last lines of var/log/oidc.log:" >&2
  tail -n 20 "$LOG" >&2
  return 1
}

down() {
  if is_running; then
    kill -TERM "$(cat "$PIDFILE")" 2>/dev/null || true
    echo "  OpenID provider stopped"
  fi
  rm -f "$PIDFILE"
}

providers() {
  secret_ensure
  printf '[{"id": "demo", "name": "Demo identity provider", "server_url": "http://%s:%s", "client_id": "gpuportal", "client_secret_file": "%s", "scopes": ["openid", "profile", "email", "groups"], "connect_existing_users": true, "api_audience": "%s/api"}]\n' \
    "$HOST" "$PORT" "$SECRET_FILE" "$PORTAL"
}

case "${1:-}" in
  install) bash scripts/npm-ci.sh scripts/oidc ;;
  up) up ;;
  down) down ;;
  providers) providers ;;
  *)
    echo "usage: $0 {install|up|down|providers}" >&2
    exit 2
    ;;
esac
