#!/usr/bin/env bash
# The browser's JavaScript and CSS libraries: installed from npm with frontend/package-lock.json, then copied
# into frontend/static/frontend/vendor/ (git-ignored), where Django serves them. No CDN, no bundler.
set -euo pipefail

bash "$(dirname "$0")/npm-ci.sh" "$(dirname "$0")/../frontend"
cd "$(dirname "$0")/../frontend"

vendor=static/frontend/vendor
rm -rf "$vendor"
mkdir -p "$vendor"
cp node_modules/htmx.org/dist/htmx.min.js "$vendor/"
cp node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css "$vendor/"
