#!/usr/bin/env python3
"""A fixed 100,000-key sample with Zipf-like weights (events/s), for plan tests and snapshots.

Run: python3 testdata/gen_keys.py > testdata/keys_100k.csv
"""
import random
import string

ALNUM = string.ascii_letters + string.digits


def main():
    rng = random.Random(100000)
    print("key,weight")
    for i in range(100_000):
        key = "sub_" + "".join(rng.choice(ALNUM) for _ in range(rng.randint(20, 26)))
        weight = round(1000.0 / (1 + i) ** 0.8 + rng.random(), 3)
        print(f"{key},{weight}")


if __name__ == "__main__":
    main()
