#!/usr/bin/env bash
# Install Debian's chromium if no Chromium is on the machine (the dashboard's browser tests drive it through
# Playwright's executable_path; Playwright's own browser download is never used). Idempotent and quiet.
# Needs root for apt-get, as on CI; where it cannot install, it says so and exits 0: the browser tests then
# skip with that message instead of failing the whole run.
set -uo pipefail
for name in chromium chromium-browser google-chrome; do
  command -v "$name" >/dev/null 2>&1 && exit 0
done
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: no chromium found and cannot apt-get install it (not root, or no apt-get):" \
    "the browser tests will be skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null; }; then
  echo "ensure-chromium: apt-get install chromium failed: the browser tests will be skipped" >&2
fi
exit 0
