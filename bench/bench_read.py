"""How fast can a window be read? Raw confluent-kafka vs the eos_kafka Spark data source.

Starts an embedded Kafka-protocol broker (or uses EOS_KAFKA_BOOTSTRAP), produces N
records over P partitions, and reads all of them three ways:

- raw:        confluent-kafka consume() loops, one process per core, counting records;
- read_range: the data source's reading function (records -> Arrow batches), one
              process per core, without Spark — what a Spark task does minus Spark;
- spark:      read_plan(...).count() in a local Spark session (cold: first query,
              Python workers start; warm: the same query again, median of 3).

Every process started here is stopped here.

    .venv/bin/python bench/bench_read.py --records 1000000
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from airflow_eos.core.source import consumer_config
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
from airflow_eos.testing.services import kafka_service


def produce(bootstrap: str, topic: str, records: int, partitions: int, value_bytes: int) -> dict[int, int]:
    """Produce ``records`` records round-robin; return each partition's end offset
    as learned from delivery reports (the broker's watermarks are not trusted)."""
    ends = dict.fromkeys(range(partitions), 0)

    def delivered(err, msg):
        if err is not None:
            raise RuntimeError(f"delivery failed: {err}")
        ends[msg.partition()] = max(ends[msg.partition()], msg.offset() + 1)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "compression.type": "none", "queue.buffering.max.messages": 500_000})
    pad = b"x" * max(0, value_bytes - 40)
    for i in range(records):
        value = b'{"id": %d, "pad": "%s"}' % (i, pad)
        while True:
            try:
                producer.produce(topic, key=b"%d" % (i % 1000), value=value, partition=i % partitions,
                                 on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    if remaining:
        raise RuntimeError(f"{remaining} records not delivered")
    return ends


def _raw_worker(bootstrap: str, ranges: list[tuple[str, int, int, int]], out) -> None:
    """Consume the ranges with one consumer, touching each record like a reader must."""
    from airflow_eos.spark.kafka_source import READER_KAFKA_DEFAULTS

    started = time.perf_counter()
    consumer = Consumer(consumer_config({**READER_KAFKA_DEFAULTS, "bootstrap.servers": bootstrap}))
    ends = {(t, p): e for t, p, _, e in ranges}
    consumer.assign([KafkaTopicPartition(t, p, s) for t, p, s, _ in ranges])
    open_ = set(ends)
    count = 0
    while open_:
        for msg in consumer.consume(10_000, 0.05):
            err = msg.error()
            key = (msg.topic(), msg.partition())
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[key]:
                    open_.discard(key)
                continue
            if msg.offset() < ends[key]:
                count += 1
                msg.value()
                msg.key()
            if msg.offset() >= ends[key] - 1:
                open_.discard(key)
    consumer.close()
    out.put((count, time.perf_counter() - started))


def _read_range_worker(bootstrap: str, ranges: list[tuple[str, int, int, int]], out) -> None:
    from airflow_eos.spark.kafka_source import KafkaRangePartition, read_range, warm_up

    warm_up()  # one-time imports, as in a reused Spark Python worker
    started = time.perf_counter()
    count = 0
    for t, p, s, e in ranges:
        for batch in read_range({"bootstrap.servers": bootstrap}, KafkaRangePartition(t, p, s, e)):
            count += batch.num_rows
    out.put((count, time.perf_counter() - started))


def run_parallel(target, bootstrap: str, plan: WindowPlan, processes: int) -> tuple[int, float]:
    """Spread the plan's ranges over ``processes`` processes; (records, seconds of
    the slowest process, from its consumer's creation: process start and imports
    are not counted)."""
    ctx = multiprocessing.get_context("spawn")
    shares: list[list] = [[] for _ in range(processes)]
    for i, r in enumerate(plan.ranges):
        shares[i % processes].append((r.topic, r.partition, r.start_offset, r.end_offset))
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(bootstrap, share, out)) for share in shares if share]
    for proc in procs:
        proc.start()
    try:
        results = [out.get(timeout=600) for _ in procs]
        total = sum(n for n, _ in results)
        elapsed = max(s for _, s in results)
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()
                proc.join()
    return total, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2,
                        help="processes for the raw reads and Spark's local[N]")
    parser.add_argument("--max-records-per-task", type=int, default=None)
    parser.add_argument("--arrow-batch-rows", type=int, default=None)
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--skip", action="append", default=[], choices=["raw", "read_range", "spark"])
    args = parser.parse_args()

    rows: list[tuple[str, int, float]] = []
    with kafka_service() as kafka:
        bootstrap = kafka.address
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
        try:
            started = time.perf_counter()
            ends = produce(bootstrap, topic, args.records, args.partitions, args.value_bytes)
            rows.append(("produce (1 producer)", args.records, time.perf_counter() - started))
            now = datetime.now(timezone.utc)
            plan = WindowPlan(Window("bench", now - timedelta(hours=1), now),
                              tuple(PartitionRange(topic, p, 0, end) for p, end in sorted(ends.items())))

            if "raw" not in args.skip:
                n, s = run_parallel(_raw_worker, bootstrap, plan, args.cores)
                rows.append((f"raw confluent-kafka ({args.cores} procs)", n, s))
            if "read_range" not in args.skip:
                n, s = run_parallel(_read_range_worker, bootstrap, plan, args.cores)
                rows.append((f"read_range -> Arrow ({args.cores} procs)", n, s))
            if "spark" not in args.skip:
                rows.extend(bench_spark(bootstrap, plan, args))
        finally:
            admin.delete_topics([topic])[topic].result(30)

    print()
    print(f"{args.records:,} records of ~{args.value_bytes} B over {args.partitions} partitions, "
          f"{args.cores} cores, broker {'external' if os.environ.get('EOS_KAFKA_BOOTSTRAP') else 'embedded'}")
    print(f"{'what':<48} {'records':>10} {'seconds':>8} {'rows/s':>10}")
    for what, n, s in rows:
        if n:
            print(f"{what:<48} {n:>10,} {s:>8.2f} {n / s:>10,.0f}")
        else:
            print(f"{what:<48} {'-':>10} {s:>8.2f} {'-':>10}")
    bad = [what for what, n, _ in rows if n and n != args.records]
    if bad:
        print(f"WRONG COUNT in: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def bench_spark(bootstrap: str, plan: WindowPlan, args) -> list[tuple[str, int, float]]:
    from airflow_eos.spark import read_plan, spark_session, stop_session

    options = {}
    if args.max_records_per_task:
        options["max_records_per_task"] = args.max_records_per_task
    if args.arrow_batch_rows:
        options["arrow_batch_rows"] = args.arrow_batch_rows
    rows = []
    started = time.perf_counter()
    spark = spark_session("eos-bench-read", master=f"local[{args.cores}]")
    try:
        spark.sparkContext.setLogLevel("ERROR")
        rows.append(("spark session start", 0, time.perf_counter() - started))
        started = time.perf_counter()
        n = read_plan(spark, plan, {"bootstrap.servers": bootstrap}, **options).count()
        rows.append(("spark eos_kafka count() (cold)", n, time.perf_counter() - started))
        # Warm: Python workers reused. The median of a few runs; one run is noisy on 2 cores.
        warm = []
        for _ in range(args.warm_runs):
            started = time.perf_counter()
            n = read_plan(spark, plan, {"bootstrap.servers": bootstrap}, **options).count()
            warm.append((n, time.perf_counter() - started))
        n, seconds = sorted(warm, key=lambda r: r[1])[len(warm) // 2]
        rows.append((f"spark eos_kafka count() (warm, median of {len(warm)})", n, seconds))
    finally:
        stop_session(spark)
    return rows


if __name__ == "__main__":
    sys.exit(main())
