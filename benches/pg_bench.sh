#!/usr/bin/env bash
# Starts a throwaway PostgreSQL 15 (as the postgres user when root, default durability:
# fsync and synchronous_commit on), runs `keyorder bench` against it, and removes it.
# Usage: bash benches/pg_bench.sh [keyorder bench flags, e.g. --events 100000 --churn 1000000]
# KEYORDER_BIN=path runs another build of keyorder (for an A/B against an older commit).
# KEYORDER_HOLD_XID=1 keeps a session idle in a transaction holding an id through the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${KEYORDER_BIN:-./target/release/keyorder}
[ -n "${KEYORDER_BIN:-}" ] || cargo build --release -q
dir=$(mktemp -d /tmp/keyorder-bench-XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_pg=()
if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$dir"; as_pg=(runuser -u postgres --); fi
cleanup() { "${as_pg[@]}" pg_ctl stop -m immediate -D "$dir/data" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
"${as_pg[@]}" initdb -A trust -U postgres -E UTF8 -D "$dir/data" >/dev/null
"${as_pg[@]}" pg_ctl start -w -D "$dir/data" -l "$dir/log" \
  -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" >/dev/null
if [ -n "${KEYORDER_HOLD_XID:-}" ]; then
  # A session idle in a transaction that holds an id for the whole run (what an operator's
  # forgotten `BEGIN` does): the drain must not slow down for it.
  psql -q -h 127.0.0.1 -p "$port" -U postgres --single-transaction \
    -c "SELECT pg_current_xact_id()" -c "SELECT pg_sleep(3600)" postgres >/dev/null 2>&1 &
  holder=$!
  trap 'kill $holder 2>/dev/null || true; cleanup' EXIT
  sleep 1
fi
"$bin" bench --database "postgres://postgres@127.0.0.1:$port/postgres" --yes "$@"
