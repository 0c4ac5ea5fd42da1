#!/usr/bin/env bash
# Prints the trace hash of a fixed set of simulation seeds: 30 small, 12 medium and 3 large
# scenarios, and every broken design of the catalogue on 4 small seeds and 1 medium one.
# Speed work on the simulation must not change a line of it: run it with the binary before
# and after the change and diff the two outputs.
#
#   bash benches/sim_hashes.sh target/release/keyorder-sim > after.txt
#
# Extra flags after the binary go to every run, e.g. `--strict-partition-order` (partition
# FIFO, the behaviour before parking) to compare with hashes taken before parking existed.
set -u
bin=${1:?usage: sim_hashes.sh PATH-TO-keyorder-sim [FLAGS...]}
shift
extra=("$@")
# `replay` exits 1 when it finds a violation (every broken design does): only its first line,
# the trace hash, matters here.
hash() { printf '%s ' "$@"; "$bin" replay "$@" "${extra[@]}" 2>/dev/null | head -1; }
for s in $(seq 0 29); do hash "$s" --size small; done
for s in $(seq 100 111); do hash "$s" --size medium; done
for s in 0 1 2; do hash "$s" --size large; done
for b in random-hash two-readers unfenced-lease flip-without-drain requeue-at-tail \
  parallel-in-partition unserialised-producers unbounded-retry handover-always-clean \
  unfenced-expiry skip-without-parking pin-without-barrier cursor-past-parked \
  cursor-past-late-commit timeout-leaves-call-running local-batch priority-within-key \
  created-at-order rebalance-on-join set-aside-head; do
  for s in 0 1 2 3; do hash "$s" --size small --break "$b"; done
  hash 7 --size medium --break "$b"
done
