#!/usr/bin/env bash
# Debian's Chromium for the browser tests (Playwright drives it; its own browser download does not work here).
set -euo pipefail

if [[ ! -x /usr/bin/chromium ]]; then
  echo "Installing Debian's chromium for the browser tests"
  if [[ ! -f /var/lib/gpuportal/apt-updated ]]; then
    apt-get update -qq
    mkdir -p /var/lib/gpuportal && touch /var/lib/gpuportal/apt-updated
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
