#!/usr/bin/env python3
"""The reference design's `partition_for`, timed over 1M keys of each shape the Rust bench uses.

Run: python3 benches/routing_reference.py
Prints keys/s per shape (one core), to compare with `cargo bench --bench routing`.
"""
import hashlib
import random
import string
import time

ALNUM = string.ascii_letters + string.digits
N = 1_000_000


def partition_for(key: str, count: int = 64) -> int:
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def keys(length, prefix):
    rng = random.Random(20261202)
    return [prefix + "".join(rng.choices(ALNUM, k=length(rng))) for _ in range(N)]


def main():
    shapes = [
        ("realistic", lambda r: r.randint(20, 26), "sub_"),
        ("short", lambda r: r.randint(1, 4), ""),
        ("200-byte", lambda r: 200, ""),
    ]
    for name, length, prefix in shapes:
        ks = keys(length, prefix)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for k in ks:
                partition_for(k)
            best = min(best, time.perf_counter() - start)
        print(f"python/{name}: {N / best:,.0f} keys/s ({best:.3f} s per 1M, best of 3)")


if __name__ == "__main__":
    main()
