#!/usr/bin/env bash
# Replays 515 seeds (300 small, 60 medium, 5 large, every broken design on 10 small seeds, 20
# with --strict-partition-order) twice, skipping idle hosts and steps (the default) and with
# --every-tick (every host ticked every millisecond, as upstream turmoil does), and prints
# every seed whose two trace hashes differ, then the totals. The idle-skipping must not change
# a single one; these seeds are disjoint from benches/sim_hashes.sh's.
#
#   bash benches/sim_stepping.sh target/release/keyorder-sim
set -u
bin=${1:?usage: sim_stepping.sh PATH-TO-keyorder-sim}
runs=0
differing=0
hash() { "$bin" replay "$@" 2>/dev/null | head -1; }
compare() {
    local skipping ticking
    skipping=$(hash "$@")
    ticking=$(hash "$@" --every-tick)
    runs=$((runs + 1))
    if [ -z "$skipping" ] || [ "$skipping" != "$ticking" ]; then
        differing=$((differing + 1))
        echo "DIFFERS: replay $* -> '$skipping' / '$ticking'"
    fi
}
for s in $(seq 1000 1299); do compare "$s" --size small; done
for s in $(seq 2000 2059); do compare "$s" --size medium; done
for s in 10 11 12 13 14; do compare "$s" --size large; done
for b in random-hash two-readers unfenced-lease flip-without-drain requeue-at-tail \
  parallel-in-partition unserialised-producers unbounded-retry handover-always-clean \
  unfenced-expiry skip-without-parking pin-without-barrier cursor-past-parked; do
  for s in $(seq 20 29); do compare "$s" --size small --break "$b"; done
done
for s in $(seq 3000 3019); do compare "$s" --size small --strict-partition-order; done
echo "runs $runs, differing $differing"
[ "$differing" -eq 0 ]
