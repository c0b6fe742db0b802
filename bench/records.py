"""The benchmark's records: what is produced into the topic (order events of
~100 B, round-robin over the partitions, timestamps spread over one hourly
window), and what the orders transform makes of them (for the COPY ceiling);
the constants every part of the bench shares."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
TOPIC = "orders"  # the example DAG's topic
PARTITIONS = 4
TARGET_COLUMNS = ("order_id", "customer", "amount", "eos_topic", "eos_partition", "eos_offset",
                  "eos_pipeline", "eos_window_start")


def order_value(i: int) -> bytes:
    """An order event of ~100 B."""
    return (b'{"order_id": "o-%09d", "customer": "c-%05d", "amount": %d.%02d, "status": "paid", "n": %d}'
            % (i, i % 10_007, (i * 37) % 100_000, i % 100, i % 7))


def produce(bootstrap: str, topic: str, records: int, partitions: int,
            value: Callable[[int], bytes] = order_value) -> dict[int, int]:
    """``records`` orders round-robin (``value(i)``, the i-th), timestamps spread over
    [T0, T0 + 1h), then one record per partition after the window (so it closes).
    Returns each partition's window end offset (from delivery reports, not the
    broker's watermarks)."""
    from confluent_kafka import Producer

    ends = dict.fromkeys(range(partitions), 0)

    def delivered(err, msg):
        if err is not None:
            raise RuntimeError(f"delivery failed: {err}")

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "compression.type": "none", "queue.buffering.max.messages": 500_000})
    t0 = int(T0.timestamp() * 1000)

    def send(partition, ts, value, key):
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=partition, timestamp=ts,
                                 on_delivery=delivered)
                return
            except BufferError:
                producer.poll(0.05)

    for i in range(records):
        p = i % partitions
        send(p, t0 + (i * 3_599_000) // records, value(i), b"%d" % (i % 1000))
        ends[p] += 1
        if i % 10_000 == 0:
            producer.poll(0)
    for p in range(partitions):
        send(p, t0 + 3_601_000, value(records + p), b"late")
    if producer.flush(300):
        raise RuntimeError("records not delivered")
    return ends


def transformed_rows(ends: dict[int, int], pipeline: str):
    """What the orders transform makes of the records, built in Python (for the
    COPY ceiling): the target's columns, as an Arrow table."""
    import pyarrow as pa

    topic_, part, off, oid, cust, amt = [], [], [], [], [], []
    counters = dict.fromkeys(ends, 0)
    for i in range(sum(ends.values())):
        p = i % PARTITIONS
        oid.append(f"o-{i:09d}")
        cust.append(f"c-{i % 10_007:05d}")
        amt.append(f"{(i * 37) % 100_000}.{i % 100:02d}")
        topic_.append(TOPIC)
        part.append(p)
        off.append(counters[p])
        counters[p] += 1
    n = len(oid)
    return pa.table({"order_id": oid, "customer": cust, "amount": amt, "eos_topic": topic_,
                     "eos_partition": pa.array(part, pa.int32()), "eos_offset": pa.array(off, pa.int64()),
                     "eos_pipeline": [pipeline] * n,
                     "eos_window_start": pa.array([T0] * n, pa.timestamp("us", "UTC"))})


def biggest_window(results: dict) -> dict:
    """The results of the run's 1M window (its biggest in a shorter run): the
    window every section's headline figures are taken from."""
    return results["sizes"].get(1_000_000) or results["sizes"][max(results["sizes"])]


def fresh_topic(bench, size: int, topic: str = TOPIC, value: Callable[[int], bytes] | None = None,
                ) -> tuple[dict[int, int], float]:
    """``topic`` again, with the window's ``size`` records (``value``: see
    :func:`produce`): each partition's end offset, and the seconds producing took."""
    import time

    from confluent_kafka.admin import NewTopic

    for f in bench.admin.delete_topics([topic]).values():
        try:
            f.result(15)
        except Exception:  # noqa: BLE001 - it did not exist
            pass
    time.sleep(0.5)
    for f in bench.admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        f.result(15)
    started = time.perf_counter()
    ends = produce(bench.bootstrap, topic, size, PARTITIONS, **({"value": value} if value else {}))
    return ends, time.perf_counter() - started
