"""The reference design's Python worker (docs: partitioned-webhook-queues), run against a
receiver that logs what it sees as `keyorder check --receiver-only` input.

The functions under "The article's code" are the article's routing.py, worker.py and
failure.py, unchanged but for two things the article leaves to the reader: the payload is
wrapped in psycopg's Jsonb (psycopg 3 does not adapt a dict by itself), and the connections
are in autocommit mode (the article's drain never commits). The article does not define
delivery_dlq; its columns are the ones DLQ_SQL inserts.

Usage: python3 reference_demo.py DSN LOG.jsonl
With REQUEUE_AT_TAIL=1 in the environment, a failed head is retried by moving it to the tail
of its partition (a new seq) instead of the article's retry at the head: a broken variant.
Faults: the receiver refuses sub_3's 2nd event twice (then accepts it), and refuses sub_1's
4th event always (so it is dead-lettered after MAX_ATTEMPTS).
"""

import hashlib
import json
import logging
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.request import Request, urlopen

import psycopg
from psycopg.types.json import Jsonb

logging.basicConfig(level=logging.WARNING)
logger = logging.getLogger(__name__)

# ---- The article's code -------------------------------------------------------------------
PARTITION_COUNT = 16
LOCK_NAMESPACE = 4711
MAX_ATTEMPTS = 5


def partition_for(key: str, count: int = PARTITION_COUNT) -> int:
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def enqueue(cur, event) -> int:
    key = event["subscription_id"]
    partition = partition_for(key)
    cur.execute(
        "INSERT INTO delivery_queue (partition, partition_key, event_id, payload)"
        " VALUES (%s, %s, %s, %s)",
        (partition, key, event["event_id"], Jsonb(event["payload"])),
    )
    return partition


CLAIM_HEAD_SQL = """
SELECT seq, event_id, partition_key, payload, attempts
FROM delivery_queue
WHERE partition = %s
ORDER BY seq
LIMIT 1
"""


def try_own_partition(conn, partition: int) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_NAMESPACE, partition))
        return bool(cur.fetchone()[0])


def release_partition(conn, partition: int) -> None:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_NAMESPACE, partition))


def drain_partition(conn, partition: int, deliver) -> None:
    while True:
        with conn.cursor() as cur:
            cur.execute(CLAIM_HEAD_SQL, (partition,))
            row = cur.fetchone()
        if row is None:
            return
        seq, event_id, key, payload, attempts = row
        try:
            deliver(key, payload)
        except Exception:
            logger.info("delivery failed for %s on partition %s", event_id, partition)
            handle_failure(conn, seq, event_id, attempts)
            return
        with conn.cursor() as cur:
            cur.execute("DELETE FROM delivery_queue WHERE seq = %s", (seq,))


RETRY_SQL = "UPDATE delivery_queue SET attempts = attempts + 1 WHERE seq = %s"
if os.environ.get("REQUEUE_AT_TAIL"):
    # NOT the article's: the tempting "retry later" that moves a failed head to the tail.
    RETRY_SQL = ("UPDATE delivery_queue SET attempts = attempts + 1,"
                 " seq = nextval('delivery_queue_seq_seq') WHERE seq = %s")

DLQ_SQL = """
WITH moved AS (
    DELETE FROM delivery_queue WHERE seq = %(seq)s
    RETURNING partition, partition_key, event_id, payload, attempts
)
INSERT INTO delivery_dlq (partition, partition_key, event_id, payload, attempts, reason)
SELECT partition, partition_key, event_id, payload, attempts, %(reason)s FROM moved
"""


def handle_failure(conn, seq: int, event_id: str, attempts: int) -> None:
    with conn.transaction():
        with conn.cursor() as cur:
            if attempts + 1 < MAX_ATTEMPTS:
                cur.execute(RETRY_SQL, (seq,))
                return
            cur.execute(DLQ_SQL, {"seq": seq, "reason": f"exhausted after {attempts + 1} attempts"})
            logger.warning("ejected %s to DLQ; partition unblocked", event_id)


# ---- The demonstration ---------------------------------------------------------------------
SCHEMA = """
DROP TABLE IF EXISTS delivery_queue, delivery_dlq;
CREATE TABLE delivery_queue (
  seq BIGSERIAL PRIMARY KEY, partition SMALLINT NOT NULL, partition_key TEXT NOT NULL,
  event_id TEXT NOT NULL UNIQUE, payload JSONB NOT NULL,
  attempts SMALLINT NOT NULL DEFAULT 0, enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now());
CREATE INDEX delivery_queue_drain_idx ON delivery_queue (partition, seq);
CREATE TABLE delivery_dlq (
  partition SMALLINT, partition_key TEXT, event_id TEXT, payload JSONB, attempts SMALLINT,
  reason TEXT);
"""

KEYS, PER_KEY = [f"sub_{i}" for i in range(6)], 8
REFUSE_TWICE, REFUSE_ALWAYS = ("sub_3", 2), ("sub_1", 4)


def main(dsn: str, log_path: str) -> None:
    log = open(log_path, "w")
    log_lock = threading.Lock()
    refused: dict[str, int] = {}

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            arrived = time.time() * 1000
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            key, order, event_id = self.headers["X-Key"], body["order"], body["event_id"]
            n = refused.get(event_id, 0)
            refuse = (key, order) == REFUSE_ALWAYS or ((key, order) == REFUSE_TWICE and n < 2)
            if refuse:
                refused[event_id] = n + 1
            self.send_response(503 if refuse else 200)
            self.end_headers()
            record = {"type": "delivery", "event_id": event_id, "key": key, "order": order,
                      "arrived_ms": arrived, "answered_ms": time.time() * 1000,
                      "outcome": "rejected" if refuse else "accepted"}
            with log_lock:
                log.write(json.dumps(record) + "\n")
                log.flush()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"

    def deliver(key: str, payload: dict) -> None:
        request = Request(url, data=json.dumps(payload).encode(), method="POST",
                          headers={"Content-Type": "application/json", "X-Key": key})
        urlopen(request, timeout=5).read()    # raises on a non-2xx: a failed delivery

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        with conn.cursor() as cur:
            for order in range(1, PER_KEY + 1):          # interleaved across keys
                for key in KEYS:
                    event_id = f"{key}-{order}"
                    enqueue(cur, {"event_id": event_id, "subscription_id": key,
                                  "payload": {"event_id": event_id, "order": order}})

    def worker() -> None:                      # the article's run(), stopping when drained
        with psycopg.connect(dsn, autocommit=True) as conn:
            while conn.execute("SELECT count(*) FROM delivery_queue").fetchone()[0] > 0:
                owned = [p for p in range(PARTITION_COUNT) if try_own_partition(conn, p)]
                try:
                    for partition in owned:
                        drain_partition(conn, partition, deliver)
                finally:
                    for partition in owned:
                        release_partition(conn, partition)
                time.sleep(0.05)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.shutdown()
    with psycopg.connect(dsn) as conn:
        dlq = conn.execute("SELECT event_id, reason FROM delivery_dlq").fetchall()
    print(f"drained {len(KEYS) * PER_KEY} events; dead-lettered: {dlq}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
