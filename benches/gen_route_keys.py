#!/usr/bin/env python3
"""Realistic keys for the end-to-end `keyorder route` measurement: `sub_` + 20-26 alphanumerics,
one per line, seeded (the same file every time).

Run: python3 benches/gen_route_keys.py 10000000 > /tmp/keys10m_realistic.txt
"""
import random
import string
import sys

ALNUM = string.ascii_letters + string.digits


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
    rng = random.Random(20261203)
    out = sys.stdout
    batch = []
    for _ in range(n):
        batch.append("sub_" + "".join(rng.choices(ALNUM, k=rng.randint(20, 26))))
        if len(batch) == 100_000:
            out.write("\n".join(batch) + "\n")
            batch.clear()
    if batch:
        out.write("\n".join(batch) + "\n")


if __name__ == "__main__":
    main()
