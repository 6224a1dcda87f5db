#!/usr/bin/env bash
# Install Debian's chromium if no Chromium is on the machine (the dashboard's browser tests drive it through
# Playwright's executable_path; Playwright's own browser download is never used). Idempotent and quiet.
# Needs root for apt-get, as on CI. Where it cannot find or install one, it says so, and then:
#   - under CI (CI=true, as CI services set it) it exits 1: a CI run must not pass with the browser tests
#     skipped (tests/integration/test_dashboard_browser.py fails them there too);
#   - elsewhere it exits 0: the browser tests skip with that message, the rest of the run goes on.
# Looks where the tests look: ORCHESTRATOR_CHROMIUM (a file), else these names on PATH.
set -uo pipefail
NAMES=(chromium chromium-browser google-chrome google-chrome-stable)

found() {
  if [ -n "${ORCHESTRATOR_CHROMIUM:-}" ]; then
    [ -f "$ORCHESTRATOR_CHROMIUM" ]
    return
  fi
  local name
  for name in "${NAMES[@]}"; do
    command -v "$name" >/dev/null 2>&1 && return 0
  done
  return 1
}

missing() {  # $1: why there is none
  case "${CI:-}" in
    true | TRUE | True | 1)
      echo "ensure-chromium: $1: CI=true, so this fails the run (the dashboard's browser tests need Chromium)" >&2
      exit 1
      ;;
  esac
  echo "ensure-chromium: $1: the browser tests will be skipped (under CI=true this fails instead)" >&2
  exit 0
}

found && exit 0
if [ -n "${ORCHESTRATOR_CHROMIUM:-}" ]; then
  missing "ORCHESTRATOR_CHROMIUM=$ORCHESTRATOR_CHROMIUM is no file"
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  missing "no chromium found (${NAMES[*]}) and cannot apt-get install it (not root, or no apt-get)"
fi
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null; }; then
  missing "apt-get install chromium failed"
fi
found || missing "apt-get install chromium succeeded but no ${NAMES[*]} is on PATH"
exit 0
