#!/usr/bin/env bash
# Makes the Python environment: Python 3.11+ with venv, then .venv with the project and its dev tools.
set -euo pipefail

cd "$(dirname "$0")/.."

apt_install() {
  if [[ ! -f /var/lib/gpuportal/apt-updated ]]; then
    apt-get update -qq
    mkdir -p /var/lib/gpuportal && touch /var/lib/gpuportal/apt-updated
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

PYTHON=${PYTHON:-python3}
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "Installing Python 3"
  apt_install python3 python3-venv
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "The portal needs Python 3.11 or newer; $PYTHON is $("$PYTHON" --version)." >&2
  exit 1
fi
if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "Installing python3-venv"
  apt_install python3-venv
fi
command -v curl >/dev/null 2>&1 || apt_install curl

# Exactly the versions in requirements.lock (`make lock` makes it from pyproject.toml), each checked against its
# hash, then the project itself without resolving anything again. Reinstall only when either file changed.
stamp=.venv/.installed-$(cat requirements.lock pyproject.toml | sha256sum | cut -c1-16)
if [[ ! -f "$stamp" ]]; then
  [[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
  .venv/bin/pip install --quiet --upgrade pip
  .venv/bin/pip install --quiet --require-hashes -r requirements.lock
  .venv/bin/pip install --quiet --no-deps -e .
  # A dependency added to or narrowed in pyproject.toml without `make lock` fails here rather than at run time.
  .venv/bin/pip check
  rm -f .venv/.installed-*
  touch "$stamp"
fi
bash scripts/frontend.sh

# This checkout's own secret key (git-ignored, readable by its owner only), which the portal reads when neither
# PORTAL_SECRET_KEY nor PORTAL_SECRET_KEY_FILE is set: the demo and the tests never run on a published key.
if [[ ! -s var/secret_key ]]; then
  mkdir -p var
  (umask 077 && .venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(50))' > var/secret_key)
fi
