#!/usr/bin/env python3
"""Cross-language routing vectors, produced by Python's hashlib (the reference design's routing).

Each output line is one JSON object: the key, the full 8-byte BLAKE2b digest in hex, and the
partition for each count in COUNTS, computed exactly as the reference `partition_for`:

    int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big") % count

Run: python3 testdata/gen_vectors.py > testdata/routing_vectors.jsonl
"""
import hashlib
import json
import random
import string

COUNTS = [1, 7, 16, 64, 1000, 32767]
ALNUM = string.ascii_letters + string.digits


def keys():
    rng = random.Random(20261202)
    fixed = [
        "sub_42", "sub_7", "a", "Z", "0", " ", "sub_", "tenant/acme/sub_1",
        "café", "naïve-résumé", "Größe", "日本語のキー", "订阅_123", "구독", "😀", "sub_🚀_x",
        "x" * 300, "é" * 150, "ключ", "مفتاح", "key with spaces", "tab\tkey", "quote\"key",
    ]
    yield from fixed
    for i in range(4000):
        n = rng.randint(20, 26)
        yield "sub_" + "".join(rng.choice(ALNUM) for _ in range(n))
    for i in range(600):
        yield f"sub_{i}"
    alphabet = ALNUM + "éüßçñ日本語中文😀🚀-_/:."
    for i in range(500):
        n = rng.randint(1, 64)
        yield "".join(rng.choice(alphabet) for _ in range(n))


def main():
    seen = set()
    for key in keys():
        if key in seen:
            continue
        seen.add(key)
        digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
        value = int.from_bytes(digest, "big")
        row = {"key": key, "digest": digest.hex()}
        row["partitions"] = {str(c): value % c for c in COUNTS}
        print(json.dumps(row, ensure_ascii=False))


if __name__ == "__main__":
    main()
