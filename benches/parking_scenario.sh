#!/usr/bin/env bash
# Issue #21's scenario with real processes: 3,000 events over 30 keys (10 of them of key K) on
# the default SQLite store and 16 partitions; a receiver answers 503 with `Retry-After: 2` to the
# first three attempts of every event of K and 204 to everything else. `keyorder work` runs with
# default flags, once with key parking (the default) and once with --strict-partition-order.
# Prints, per run: when the other partitions finished, when K's partition-mates finished, when K
# finished, the shortest gap between two attempts of one K event, and the dead letters.
#
#   bash benches/parking_scenario.sh [PATH-TO-keyorder]     (default: target/release/keyorder)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/keyorder}
[ -x "$bin" ] || { echo "no $bin: cargo build --release first" >&2; exit 2; }
dir=$(mktemp -d /tmp/keyorder-parking-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT

python3 - "$dir/events.jsonl" <<'PY'
import json, sys
keys = [f"sub_{i:02d}" for i in range(30)]
with open(sys.argv[1], "w") as f:
    n = {k: 0 for k in keys}
    i = 0
    # K (sub_00) gets 10 events spread through the stream; the other 29 keys share 2,990.
    while sum(n.values()) < 3000:
        k = keys[i % 30]
        i += 1
        if k == "sub_00" and n[k] >= 10:
            continue
        if k != "sub_00" and sum(v for kk, v in n.items() if kk != "sub_00") >= 2990:
            continue
        f.write(json.dumps({"event_id": f"{k}-{n[k]}", "subscription_id": k, "tenant_id": "t",
                            "resource_id": "r", "payload": {"n": n[k]}}) + "\n")
        n[k] += 1
PY

run() {
  local label=$1; shift
  local db="$dir/$label.db" log="$dir/$label.log" port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$bin" enqueue --database "sqlite:$db" "$dir/events.jsonl" >/dev/null
  python3 - "$port" "$log" <<'PY' &
import http.server, sys, time, threading
port, log = int(sys.argv[1]), sys.argv[2]
rows, done, lock = [], set(), threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        key, attempt = self.headers["x-keyorder-key"], int(self.headers["x-keyorder-attempt"])
        fail = key == "sub_00" and attempt <= 3
        with lock:
            rows.append((time.monotonic(), key, self.headers["x-keyorder-event-id"],
                         int(self.headers["x-keyorder-partition"]), attempt, 503 if fail else 204))
            if not fail:
                done.add(self.headers["x-keyorder-event-id"])
        self.send_response(503 if fail else 204)
        if fail:
            self.send_header("retry-after", "2")
        self.send_header("content-length", "0")
        self.end_headers()
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
deadline = time.monotonic() + 300
while len(done) < 3000 and time.monotonic() < deadline:
    time.sleep(0.05)
with lock, open(log, "w") as f:
    for r in rows:
        f.write("\t".join(map(str, r)) + "\n")
srv.shutdown()
PY
  local receiver=$!
  sleep 0.3
  "$bin" work --database "sqlite:$db" --deliver "http://127.0.0.1:$port/hook" "$@" 2>/dev/null &
  local worker=$!
  wait "$receiver"
  kill -TERM "$worker"; wait "$worker" || true
  local dead
  dead=$("$bin" dlq --database "sqlite:$db" list | wc -l)
  python3 - "$log" "$label" "$dead" <<'PY'
import sys, collections
log, label, dead = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [l.rstrip("\n").split("\t") for l in open(log)]
rows = [(float(t), k, e, int(p), int(a), int(s)) for t, k, e, p, a, s in rows]
t0 = min(r[0] for r in rows)
kp = next(r[3] for r in rows if r[1] == "sub_00")
last = collections.defaultdict(float)
for t, k, e, p, a, s in rows:
    if s == 204:
        last[(p, k)] = max(last[(p, k)], t - t0)
mates = max(v for (p, k), v in last.items() if p == kp and k != "sub_00")
others = max(v for (p, k), v in last.items() if p != kp)
k_done = max(v for (p, k), v in last.items() if k == "sub_00")
tries = collections.defaultdict(list)
for t, k, e, p, a, s in rows:
    if k == "sub_00":
        tries[e].append(t)
gap = min(b - a for ts in tries.values() for a, b in zip(sorted(ts), sorted(ts)[1:]))
order = [e for t, k, e, p, a, s in rows if k == "sub_00" and s == 204]
in_order = order == sorted(order, key=lambda e: int(e.split("-")[1]))
mates_keys = sorted({k for (p, k) in last if p == kp and k != "sub_00"})
print(f"{label:<8} other partitions done {others:6.2f} s | K's partition-mates ({', '.join(mates_keys)}) done {mates:6.2f} s | "
      f"K done {k_done:6.2f} s, in order: {in_order}, shortest retry gap {gap:.2f} s | dead letters {dead}")
PY
}

run parking
run strict --strict-partition-order
