#!/usr/bin/env bash
# The new user's first try, end to end: a producer that knows only the reference schema
# inserts EVENTS events over KEYS keys into a throwaway PostgreSQL 15; `keyorder work` with
# its defaults delivers them to the simplest receiver people write, Python's
# http.server.ThreadingHTTPServer with its HTTP/1.0 default (no keep-alive, no Content-Length
# on the reply). Prints the time from starting the worker to the last delivery, and checks
# that every event arrived and each key's events arrived in enqueue order.
#
# Usage: bash benches/python_receiver.sh [EVENTS] [KEYS]     (defaults 3000 and 60)
set -euo pipefail
cd "$(dirname "$0")/.."
events=${1:-3000}
keys=${2:-60}
cargo build --release -q -p keyorder
dir=$(mktemp -d /tmp/keyorder-pyrecv-XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pg_port=$(free_port)
hook_port=$(free_port)
as_pg=()
if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$dir"; as_pg=(runuser -u postgres --); fi
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    "${as_pg[@]}" pg_ctl stop -m immediate -D "$dir/data" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
"${as_pg[@]}" initdb -A trust -U postgres -E UTF8 -D "$dir/data" >/dev/null
"${as_pg[@]}" pg_ctl start -w -D "$dir/data" -l "$dir/log" \
  -o "-p $pg_port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" >/dev/null
url="postgres://postgres@127.0.0.1:$pg_port/postgres"
./target/release/keyorder migrate --database "$url" >/dev/null

# The reference producer: its routing and its INSERT, nothing of keyorder's.
python3 - "$events" "$keys" <<'EOF' | psql -q -h 127.0.0.1 -p "$pg_port" -U postgres postgres
import hashlib, json, sys
events, keys = int(sys.argv[1]), int(sys.argv[2])
def partition_for(key, count=16):
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % count
print("BEGIN;")
for i in range(events):
    key = f"sub_{i % keys:04d}"
    payload = json.dumps({"n": i, "key": key}).replace("'", "''")
    print(f"INSERT INTO delivery_queue (partition, partition_key, event_id, payload) "
          f"VALUES ({partition_for(key)}, '{key}', 'evt_{i:06d}', '{payload}');")
print("COMMIT;")
EOF

# The receiver: http.server's defaults, one line per delivery (key, event id) in arrival order.
cat > "$dir/receiver.py" <<'EOF'
import http.server, sys
log = open(sys.argv[2], "a", buffering=1)
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        log.write(f"{self.headers.get('X-Keyorder-Key')} {self.headers.get('X-Keyorder-Event-Id')}\n")
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Hook).serve_forever()
EOF
python3 "$dir/receiver.py" "$hook_port" "$dir/deliveries" &
pids+=($!)
for _ in $(seq 50); do python3 -c "import socket; socket.create_connection(('127.0.0.1', $hook_port))" 2>/dev/null && break; sleep 0.1; done

start=$(date +%s.%N)
./target/release/keyorder work --database "$url" --deliver "http://127.0.0.1:$hook_port/hook" 2>"$dir/worker.log" &
pids+=($!)
while :; do
    n=$(wc -l <"$dir/deliveries" 2>/dev/null || echo 0)
    [ "$n" -ge "$events" ] && break
    now=$(date +%s.%N)
    if (( $(echo "$now - $start > 120" | bc) )); then echo "only $n of $events delivered after 120 s" >&2; tail "$dir/worker.log" >&2; exit 1; fi
    sleep 0.05
done
end=$(date +%s.%N)
python3 - "$dir/deliveries" "$events" <<'EOF'
import sys
seen, last = set(), {}
for line in open(sys.argv[1]):
    key, event = line.split()
    n = int(event.removeprefix("evt_"))
    if event in seen:
        continue
    seen.add(event)
    if last.get(key, -1) > n:
        sys.exit(f"REORDER: {event} of {key} arrived after evt_{last[key]:06d}")
    last[key] = n
if len(seen) != int(sys.argv[2]):
    sys.exit(f"LOST: {int(sys.argv[2]) - len(seen)} events never arrived")
print(f"all {len(seen)} events delivered, each key in order")
EOF
printf '%s events over %s keys to http.server (HTTP/1.0): %.2f s from starting the worker, %.0f deliveries/s\n' \
    "$events" "$keys" "$(echo "$end - $start" | bc)" "$(echo "$events / ($end - $start)" | bc -l)"
