#!/usr/bin/env python3
"""The Python baseline of docs/measurements/checker.md: `json.loads` on every line of a
history, nothing else. Prints the record count and records per second.

    python3 benches/json_loads.py /tmp/h1m.jsonl
"""

import json
import sys
import time


def main():
    start = time.perf_counter()
    n = 0
    with open(sys.argv[1], "rb") as f:
        for line in f:
            if line.strip():
                json.loads(line)
                n += 1
    took = time.perf_counter() - start
    print(f"{n} records in {took:.2f} s: {n / took:,.0f} records/s")


if __name__ == "__main__":
    main()
