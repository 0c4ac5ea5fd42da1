#!/usr/bin/env python3
"""A seeded delivery history in the JSON-lines format of `keyorder check`, for measuring it.

Events are spread over --keys keys (key k on partition k mod --partitions); each is enqueued
and then delivered once, accepted, one millisecond apart, so the file is in time order and
keeps the contract. With --dead-letter-every N, every Nth event is refused once and
dead-lettered instead, and the next event of its key (delivered later) is a counted gap.

    python3 benches/gen_history.py --events 1000000 --seed 1 > /tmp/h1m.jsonl
    python3 benches/gen_history.py --events 80000 --dead-letter-every 2 > /tmp/dl.jsonl
"""

import argparse
import random
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dead-letter-every", type=int, default=0, metavar="N")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    out = sys.stdout
    write = out.write
    buf = []
    for i in range(args.events):
        k = rng.randrange(args.keys)
        p = k % args.partitions
        t = i + 1
        ev = f"evt_{i:09d}"
        buf.append(
            f'{{"type":"enqueued","event_id":"{ev}","key":"sub_{k}","seq":{i + 1},'
            f'"partition":{p},"at_ms":{t}.0}}\n'
        )
        if args.dead_letter_every and i % args.dead_letter_every == 0:
            buf.append(
                f'{{"type":"delivery","event_id":"{ev}","key":"sub_{k}","partition":{p},'
                f'"worker":"w{p % 4}","attempt":1,"sent_ms":{t}.2,"arrived_ms":{t}.3,'
                f'"answered_ms":{t}.5,"outcome":"rejected","reason":"HTTP 503"}}\n'
            )
            buf.append(
                f'{{"type":"dead_letter","event_id":"{ev}","reason":"exhausted","at_ms":{t}.6}}\n'
            )
        else:
            buf.append(
                f'{{"type":"delivery","event_id":"{ev}","key":"sub_{k}","partition":{p},'
                f'"worker":"w{p % 4}","attempt":1,"sent_ms":{t}.2,"arrived_ms":{t}.3,'
                f'"answered_ms":{t}.5,"outcome":"accepted"}}\n'
            )
        if len(buf) >= 4096:
            write("".join(buf))
            buf.clear()
    write("".join(buf))
    write(f'{{"type":"end","at_ms":{args.events + 1}.0}}\n')


if __name__ == "__main__":
    main()
