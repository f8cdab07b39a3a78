#!/usr/bin/env bash
# The browser's JavaScript and CSS libraries: installed from npm with frontend/package-lock.json, then copied
# into frontend/static/frontend/vendor/ (git-ignored), where Django serves them. No CDN, no bundler.
set -euo pipefail

cd "$(dirname "$0")/../frontend"

if ! command -v npm >/dev/null 2>&1; then
  echo "Installing Node.js and npm"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

# Reinstall only when the lockfile changed since the last install.
stamp=node_modules/.installed-$(sha256sum package-lock.json | cut -c1-16)
if [[ ! -f "$stamp" ]]; then
  npm ci --no-audit --no-fund --loglevel=error
  touch "$stamp"
fi

vendor=static/frontend/vendor
rm -rf "$vendor"
mkdir -p "$vendor"
cp node_modules/htmx.org/dist/htmx.min.js "$vendor/"
cp node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css "$vendor/"
