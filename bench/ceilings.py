"""The ceilings a window is compared with, measured on the same records in the
same run: raw confluent-kafka consume (one process per core), raw PostgreSQL
COPY of the rows the transform produces (one connection per core, encoded
beforehand as the sink encodes them: binary COPY), raw Spark read of the planned ranges (count() with each
reader: Spark's own Kafka source, observed, and the eos_kafka source; in-process local[cores] session, warm)."""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time

from measure import CpuMeter, checkpoint, mean_cpu

from airflow_eos.spark.kafka_source import DEFAULT_MAX_RECORDS_PER_TASK
from airflow_eos.spark.submit import DEFAULT_READER, READERS, SPARK_READER
from records import HOUR, T0, TARGET_COLUMNS, TOPIC, transformed_rows

COPY_TABLE = "analytics.orders_copy"


def measure_ceilings(size: int, ends: dict[int, int], bootstrap: str, pg_url: str, url: str, cores: int,
                     meter: CpuMeter) -> dict:
    """The three ceilings of one window size, as results.json's ``ceiling_*`` entries."""
    n, s, cpu = raw_consume(bootstrap, ends, cores, meter)
    assert n == size, (n, size)
    r = {"ceiling_consume": {"seconds": s, "records_per_s": size / s, "processes": cores, "cpu_s": cpu}}
    checkpoint(pg_url)
    n, s, cpu = raw_copy(url, transformed_rows(ends, f"copy_{size}"), cores, meter)
    assert n == size, (n, size)
    r["ceiling_copy"] = {"seconds": s, "records_per_s": size / s, "connections": cores, "cpu_s": cpu}
    for reader in READERS:  # the default reader is the ceiling; the other is measured beside it
        sr = spark_read(bootstrap, {size: ends}, {size: TOPIC}, cores, meter, reader=reader)
        key = "ceiling_spark_read" if reader == DEFAULT_READER else f"ceiling_spark_read_{reader}"
        r[key] = {"seconds": sr[size], "records_per_s": size / sr[size], "reader": reader,
                  "session_start_s": sr["session_start_s"], "cold_s": sr["cold_s"], "cpu_s": sr[("cpu", size)]}
    reads = ", ".join(f"{r[k]['reader']} {size / r[k]['seconds']:,.0f}/s ({r[k]['cpu_s']['ours']:.2f} core-s)"
                      for k in r if k.startswith("ceiling_spark_read"))
    print(f"   ceilings: consume {size / r['ceiling_consume']['seconds']:,.0f}/s, "
          f"COPY {size / r['ceiling_copy']['seconds']:,.0f}/s, spark read: {reads}", flush=True)
    return r


# --------------------------------------------------------------------------- ceiling: raw consume


def _raw_worker(bootstrap: str, ranges: list[tuple[str, int, int, int]], out) -> None:
    """Consume the ranges with one consumer, touching each record like a reader must."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    from airflow_eos.core.kafka_client import READER_KAFKA_DEFAULTS
    from airflow_eos.core.source import consumer_config

    started, cpu_started = time.perf_counter(), time.process_time()
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
    out.put((count, time.perf_counter() - started, time.process_time() - cpu_started))


def raw_consume(bootstrap: str, ends: dict[int, int], processes: int, meter: CpuMeter) -> tuple[int, float, dict]:
    """Spread the ranges over ``processes`` processes; (records, seconds of the
    slowest, from its consumer's creation: process start and imports not counted,
    CPU by part: the consumers' own from their creation, the broker's throughout)."""
    ctx = multiprocessing.get_context("spawn")
    shares: list[list] = [[] for _ in range(processes)]
    for i, (p, end) in enumerate(sorted(ends.items())):
        shares[i % processes].append((TOPIC, p, 0, end))
    out = ctx.Queue()
    procs = [ctx.Process(target=_raw_worker, args=(bootstrap, share, out)) for share in shares if share]
    with meter.measure() as cpu:
        for proc in procs:
            proc.start()
        try:
            results = [out.get(timeout=600) for _ in procs]
        finally:
            for proc in procs:
                proc.join(timeout=30)
                if proc.is_alive():
                    proc.terminate()
                    proc.join()
    seconds = dict(cpu.seconds)
    consumers = sum(c for _, _, c in results)
    # Not the spawn and imports: the consumers' own CPU from their creation. The
    # machine's busy time keeps the others' load (machine - ours) of the whole span.
    seconds["machine"] += consumers - seconds["ended"]
    seconds["ours"] += consumers - seconds["ended"]
    seconds["ended"] = consumers
    seconds["wall"] = max(s for _, s, _ in results)
    return sum(n for n, _, _ in results), seconds["wall"], seconds


# --------------------------------------------------------------------------- ceiling: raw COPY

def raw_copy(url: str, table, connections: int, meter: CpuMeter) -> tuple[int, float, dict]:
    """COPY the rows (encoded beforehand by the sink's encoder) with ``connections``
    connections in parallel, each in one transaction, into an empty table shaped
    like the target."""
    import psycopg
    import pyarrow as pa
    from psycopg import sql

    from airflow_eos.staging.encoding import column_types, encoder_for

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {COPY_TABLE}")
        conn.execute(f"CREATE TABLE {COPY_TABLE} (LIKE analytics.orders INCLUDING ALL)")
    # the amount as the orders transform gives it to the sink (a decimal(12,2)), not as JSON text
    table = table.set_column(table.schema.get_field_index("amount"), "amount",
                             table.column("amount").cast(pa.decimal128(12, 2)))
    n = table.num_rows
    parts = [table.slice(n * i // connections, n * (i + 1) // connections - n * i // connections)
             for i in range(connections)]
    with psycopg.connect(url) as conn:
        types = column_types(conn, sql.Identifier(*COPY_TABLE.split(".")))
    encoder = encoder_for(table.select(list(TARGET_COLUMNS)).schema, types)
    payloads = [[encoder.header()] + [encoder.encode(b) for b in part.select(list(TARGET_COLUMNS)).to_batches(
        max_chunksize=20_000)] + [encoder.trailer()] for part in parts]
    conns = [psycopg.connect(url) for _ in parts]
    errors = []

    def copy(conn, chunks):
        try:
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("SET LOCAL TIME ZONE 'UTC'")
                with cur.copy(f"COPY {COPY_TABLE} ({', '.join(TARGET_COLUMNS)}) FROM STDIN (FORMAT {encoder.option})") as cp:
                    for chunk in chunks:
                        cp.write(chunk)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=copy, args=(c, p)) for c, p in zip(conns, payloads)]
    with meter.measure() as cpu:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    seconds = cpu.seconds["wall"]
    for c in conns:
        c.close()
    if errors:
        raise errors[0]
    with psycopg.connect(url, autocommit=True) as conn:
        copied = conn.execute(f"SELECT count(*) FROM {COPY_TABLE}").fetchone()[0]
        conn.execute(f"DROP TABLE {COPY_TABLE}")
    return copied, seconds, cpu.seconds


# --------------------------------------------------------------------------- ceiling: raw Spark read


def spark_read(bootstrap: str, ends_by_size: dict[int, dict[int, int]], topics: dict[int, str], cores: int,
               meter: CpuMeter, runs: int = 2, reader: str = DEFAULT_READER) -> dict:
    """count() of each size's ranges read by ``reader`` (Spark's own Kafka source,
    observed as the stage job observes it, or the eos_kafka source) in one
    in-process session: one cold run first, then the median of ``runs`` warm
    runs per size (and their mean CPU)."""
    from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
    from airflow_eos.spark import spark_session, stop_session

    def read_plan(spark, plan, config):
        if reader == SPARK_READER:
            from airflow_eos.spark.kafka_native import read_plan_native

            return read_plan_native(spark, plan, config, max_records_per_task=DEFAULT_MAX_RECORDS_PER_TASK)[0]
        from airflow_eos.spark.kafka_source import read_plan as read_eos_kafka

        return read_eos_kafka(spark, plan, config)

    out: dict = {}
    started = time.perf_counter()
    spark = spark_session(f"eos-bench-read-{reader}", master=f"local[{cores}]")
    try:
        spark.sparkContext.setLogLevel("ERROR")
        out["session_start_s"] = time.perf_counter() - started
        config = {"bootstrap.servers": bootstrap}
        for size, ends in ends_by_size.items():
            plan = WindowPlan(Window("bench_read", T0, T0 + HOUR),
                              tuple(PartitionRange(topics[size], p, 0, e) for p, e in sorted(ends.items())))
            if "cold_s" not in out:
                t = time.perf_counter()
                read_plan(spark, plan, config).count()
                out["cold_s"] = time.perf_counter() - t
            timings, cpus = [], []
            for _ in range(runs):
                with meter.measure() as cpu:
                    n = read_plan(spark, plan, config).count()
                timings.append(cpu.seconds["wall"])
                cpus.append(cpu.seconds)
                if n != size:
                    raise RuntimeError(f"spark read {n} records, expected {size}")
            out[size] = statistics.median(timings)
            out[("cpu", size)] = mean_cpu(cpus)
    finally:
        stop_session(spark)
    return out
