#!/usr/bin/env bash
# The browser's JavaScript and CSS libraries: installed from npm with frontend/package-lock.json, then copied
# into frontend/static/frontend/vendor/ (git-ignored), where Django serves them. No CDN, no bundler.
# axe-core goes to frontend/test-vendor/ (git-ignored, not served): only the browser tests inject it into pages.
set -euo pipefail

bash "$(dirname "$0")/npm-ci.sh" "$(dirname "$0")/../frontend"
cd "$(dirname "$0")/../frontend"

vendor=static/frontend/vendor
rm -rf "$vendor"
mkdir -p "$vendor"
cp node_modules/htmx.org/dist/htmx.min.js "$vendor/"
cp node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css "$vendor/"

test_vendor=test-vendor
rm -rf "$test_vendor"
mkdir -p "$test_vendor"
cp node_modules/axe-core/axe.min.js "$test_vendor/"
