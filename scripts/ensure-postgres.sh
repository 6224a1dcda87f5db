#!/usr/bin/env bash
# Start the machine's PostgreSQL if it is not answering (CI machines have it installed, maybe stopped).
set -euo pipefail
if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then exit 0; fi
if ! command -v pg_ctlcluster >/dev/null; then
  apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
fi
version=$(ls /etc/postgresql | sort -n | tail -1)
pg_ctlcluster --skip-systemctl-redirect "$version" main start
for _ in $(seq 30); do pg_isready -h 127.0.0.1 -p 5432 -q && exit 0; sleep 1; done
echo "PostgreSQL did not start on 127.0.0.1:5432" >&2; exit 1
