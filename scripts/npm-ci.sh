#!/usr/bin/env bash
# `npm ci` in the folder given, from its package-lock.json, only when the lockfile changed since the last install;
# Node.js and npm from Debian first when they are missing. Used for the browser's libraries (scripts/frontend.sh)
# and the demo's OpenID provider (scripts/oidc.sh).
set -euo pipefail

cd "$1"

if ! command -v npm >/dev/null 2>&1; then
  echo "Installing Node.js and npm"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

stamp=node_modules/.installed-$(sha256sum package-lock.json | cut -c1-16)
if [[ ! -f "$stamp" ]]; then
  npm ci --no-audit --no-fund --loglevel=error
  touch "$stamp"
fi
