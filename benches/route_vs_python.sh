#!/usr/bin/env bash
# Issue #24 item 5: `keyorder route` end to end against the Python reference loop, measured in
# one run so both see the same machine. The Rust side is the whole command over the 10M-key
# file (`route --partitions 64 FILE > /dev/null`: reading, validating, hashing, formatting,
# writing); the Python side is only the loop of `benches/routing_reference.py`'s
# `partition_for` (hashlib.blake2b, digest_size=8, big-endian, % 64) over keys already in
# memory (the first PY_KEYS keys of the same file), so Python is not charged for its I/O.
# Runs alternate (Rust, Python, Rust, ...), so a neighbour's load falls on both; medians, ranges
# and the ratio of the median rates are printed, with CPU seconds (the machine is shared).
#
#   bash benches/route_vs_python.sh [PATH-TO-keyorder] [KEYS-FILE]
#       (defaults: target/release/keyorder, /tmp/keys.txt; generated when missing)
#   RUNS=5 PY_KEYS=2000000 bash benches/route_vs_python.sh ...
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/keyorder}
keys=${2:-/tmp/keys.txt}
[ -x "$bin" ] || { echo "no $bin: cargo build --release first" >&2; exit 2; }
if [ ! -s "$keys" ]; then
    echo "generating $keys (10M realistic keys)" >&2
    python3 benches/gen_route_keys.py 10000000 > "$keys"
fi
cat "$keys" > /dev/null # into the page cache: both sides read from memory
python3 - "$bin" "$keys" "${RUNS:-5}" "${PY_KEYS:-2000000}" <<'PY'
import os, resource, statistics, subprocess, sys, time
sys.path.insert(0, "benches")
from routing_reference import partition_for

bin_, path, runs, py_keys = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with open(path, "rb") as f:
    n_keys = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
with open(path, encoding="utf-8") as f:
    ks = [line.rstrip("\n") for _, line in zip(range(py_keys), f)]


def rust():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([bin_, "route", "--partitions", "64", path], stdout=subprocess.DEVNULL,
                   check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return n_keys / wall, wall, cpu


def python():
    cpu0, start = time.process_time(), time.perf_counter()
    for k in ks:
        partition_for(k, 64)
    wall = time.perf_counter() - start
    return len(ks) / wall, wall, time.process_time() - cpu0


rs, ps = [], []
for i in range(runs):
    rs.append(rust())
    ps.append(python())
    print(f"round {i + 1}: keyorder route {rs[-1][0] / 1e6:6.2f} M keys/s "
          f"({rs[-1][1]:.3f} s wall, {rs[-1][2]:.3f} s CPU), python loop "
          f"{ps[-1][0] / 1e6:5.2f} M keys/s ({ps[-1][1]:.3f} s wall)", flush=True)


def summary(name, xs, n):
    rates = [x[0] / 1e6 for x in xs]
    cpu = statistics.median(x[2] for x in xs)
    print(f"{name}: median {statistics.median(rates):.2f} M keys/s "
          f"(range {min(rates):.2f}-{max(rates):.2f}) over {n:,} keys, "
          f"median wall {statistics.median(x[1] for x in xs):.3f} s, "
          f"CPU {cpu:.3f} s ({cpu / n * 1e9:.0f} ns/key)")
    return statistics.median(rates)


r = summary(f"keyorder route ({os.path.basename(bin_)})", rs, n_keys)
p = summary("python reference loop", ps, len(ks))
print(f"ratio keyorder/python (median rates): {r / p:.1f}x")
PY
