#!/usr/bin/env bash
# Issue #20's whale scenario with real processes: 20,000 events on the default SQLite store and
# 16 partitions, half of them (10,000) of one whale key W and the rest over 160 other keys. The
# other keys are drawn from those that do not hash to partition 15 (the partition kept for
# whales), so a pin can give W a partition of its own. `keyorder work` (2 threads) drains to a
# Python receiver answering 204, once with W routed by its hash and once with W pinned to 15
# (`keyorder pin W 15` before the enqueue). Prints, per run: when W's hash partition-mates
# finished, when the other keys finished, when W finished.
#
#   bash benches/whale_pin.sh [PATH-TO-keyorder]     (default: target/release/keyorder)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/keyorder}
[ -x "$bin" ] || { echo "no $bin: cargo build --release first" >&2; exit 2; }
dir=$(mktemp -d /tmp/keyorder-whale-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT

# Which keys hash to which partition, by keyorder's own routing.
python3 -c 'print("whale"); [print(f"sub_{i:04d}") for i in range(400)]' > "$dir/keys.txt"
"$bin" route --partitions 16 "$dir/keys.txt" > "$dir/routes.txt"
python3 - "$dir/keys.txt" "$dir/routes.txt" "$dir/events.jsonl" <<'PY'
import json, sys
keys = [l.strip() for l in open(sys.argv[1]) if l.strip()]
part = dict(zip(keys, (int(l) for l in open(sys.argv[2]) if l.strip())))
others = [k for k in part if k != "whale" and part[k] != 15][:160]
with open(sys.argv[3], "w") as f:
    n = 0
    for i in range(10000):
        # Interleaved: whale, other, whale, other, ...
        for k in ("whale", others[i % 160]):
            f.write(json.dumps({"event_id": f"e{n}", "subscription_id": k, "tenant_id": "t",
                                "resource_id": "r", "payload": {"n": n}}) + "\n")
            n += 1
print(f"whale hashes to partition {part['whale']}; {sum(1 for k in others if part[k] == part['whale'])} other keys share it",
      file=sys.stderr)
PY

run() {
  local label=$1 pin=$2
  local db="$dir/$label.db" log="$dir/$label.log" port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$bin" migrate --database "sqlite:$db" --partitions 16 >/dev/null
  if [ "$pin" = yes ]; then "$bin" pin --database "sqlite:$db" whale 15 >/dev/null; fi
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
        with lock:
            rows.append((time.monotonic(), self.headers["x-keyorder-key"],
                         int(self.headers["x-keyorder-partition"]), int(self.headers["x-keyorder-seq"])))
            done.add(self.headers["x-keyorder-event-id"])
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
deadline = time.monotonic() + 600
while len(done) < 20000 and time.monotonic() < deadline:
    time.sleep(0.05)
with lock, open(log, "w") as f:
    for r in rows:
        f.write("\t".join(map(str, r)) + "\n")
srv.shutdown()
PY
  local receiver=$!
  sleep 0.3
  "$bin" work --database "sqlite:$db" --deliver "http://127.0.0.1:$port/hook" --threads 2 2>/dev/null &
  local worker=$!
  wait "$receiver"
  kill -TERM "$worker"; wait "$worker" || true
  python3 - "$log" "$label" <<'PY'
import sys, collections
log, label = sys.argv[1], sys.argv[2]
rows = [l.rstrip("\n").split("\t") for l in open(log)]
rows = [(float(t), k, int(p), int(s)) for t, k, p, s in rows]
t0 = min(r[0] for r in rows)
wp = {}
last = collections.defaultdict(float)
seqs = collections.defaultdict(list)
for t, k, p, s in rows:
    last[k] = max(last[k], t - t0)
    seqs[k].append(s)
    if k != "whale":
        wp[k] = p
hash_p = int(open(sys.argv[1].replace(f"{label}.log", "whale_hash")).read())
mates = [k for k, p in wp.items() if p == hash_p]
rest = [k for k in wp if wp[k] != hash_p]
in_order = all(s == sorted(s) for s in seqs.values())
print(f"{label:<9} W's hash partition-mates ({len(mates)} keys) done {max(last[k] for k in mates):6.2f} s | "
      f"the other {len(rest)} keys done {max(last[k] for k in rest):6.2f} s | W done {last['whale']:6.2f} s | "
      f"every key in seq order: {in_order}")
PY
}

head -1 "$dir/routes.txt" > "$dir/whale_hash"
run hashed no
run pinned yes
