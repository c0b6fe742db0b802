"""Micro-benchmark of the PostgreSQL stage writer alone (issue 20 §2): N orders
rows as the orders transform gives them to the sink (large strings, decimal
amounts, int32/int64 lineage; 10k-row Arrow batches), one chunk each into a
partition_per_window staging, CSV and binary COPY alternating, CHECKPOINT
before each: wall, this process's CPU (encoding, client) and PostgreSQL's
(backends, reaped ones included). Not part of `make bench`:

    .venv/bin/python bench/writer_copy.py [N=1000000]
"""
import sys
import time
from datetime import datetime, timedelta, timezone
import psutil, psycopg, pyarrow as pa
from airflow_eos.embedded import PostgresServer
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
from airflow_eos.examples.tables import PARTITIONED_ORDERS_TABLE_DDL
from airflow_eos.staging import writer as writer_mod
from airflow_eos.staging.encoding import CopyEncoder, CopyFormat, encoder_for
from airflow_eos.targets.postgres.target import PostgresTarget

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)

def rows(pipeline, n):
    i = pa.array(range(n), pa.int64())
    import pyarrow.compute as pc
    oid = pc.binary_join_element_wise("o-", pc.cast(i, pa.string()), "")
    cust = pc.binary_join_element_wise("c-", pc.cast(pc.bit_wise_and(i, 8191), pa.string()), "")
    amt = pc.cast(pc.cast(pc.bit_wise_and(pc.multiply(i, 37), 1048575), pa.string()), pa.decimal128(12, 2))
    t = pa.table({"order_id": oid.cast(pa.large_string()), "customer": cust.cast(pa.large_string()), "amount": amt,
                  "eos_topic": pa.array(["orders"] * n, pa.large_string()),
                  "eos_partition": pa.array([k % 8 for k in range(n)], pa.int32()), "eos_offset": i,
                  "eos_pipeline": pa.array([pipeline] * n, pa.large_string()),
                  "eos_window_start": pa.array([T0] * n, pa.timestamp("us", "UTC"))})
    return t.to_batches(max_chunksize=10_000)

def tree_cpu(p):
    s = 0.0
    for q in (p, *p.children(recursive=True)):
        try:
            c = q.cpu_times(); s += c.user + c.system + c.children_user + c.children_system
        except psutil.Error: pass
    return s

with PostgresServer() as server:
    url = server.url
    Ledger(url).migrate()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(PARTITIONED_ORDERS_TABLE_DDL)
        pm = psutil.Process(psutil.Process(c.execute("SELECT pg_backend_pid()").fetchone()[0]).ppid())
    target = PostgresTarget(url, "analytics.orders_partitioned", mode="partition_per_window").sink()
    ledger = Ledger(url)
    results = {}
    for rep, fmt in enumerate(["csv", "binary", "csv", "binary"]):
        window = Window("bench", T0 + timedelta(hours=rep), T0 + timedelta(hours=rep + 1))
        plan = WindowPlan(window, (PartitionRange("orders", 0, 0, N),))
        with ledger.connect() as conn, conn.transaction():
            ledger.lock_pipeline(conn, "bench"); ledger.freeze(conn, plan, [])
        attempt = target.begin(window)
        writer = target.writer(attempt)
        batches = rows("bench", N)
        batches = [b.select(list(writer.columns)) for b in batches]
        writer_mod.encoder_for = (lambda s, t: CopyEncoder(CopyFormat.CSV)) if fmt == "csv" else encoder_for
        with psycopg.connect(url, autocommit=True) as c: c.execute("CHECKPOINT")
        me = psutil.Process()
        c0, p0, w0 = time.process_time(), tree_cpu(pm), time.perf_counter()
        chunk = writer.write(batches)
        c1, p1, w1 = time.process_time(), tree_cpu(pm), time.perf_counter()
        assert chunk.rows == N
        with psycopg.connect(url) as c:
            assert c.execute(f'SELECT count(*), sum(amount), count(DISTINCT eos_offset) FROM eos_staging."{attempt.staging}"').fetchone()[0] == N
        print(f"{fmt:6s} wall {w1-w0:.2f}s  client CPU {c1-c0:.2f}s  postgres CPU {p1-p0:.2f}s  total {c1-c0+p1-p0:.2f} core-s", flush=True)
        results.setdefault(fmt, []).append((w1-w0, c1-c0, p1-p0))
        target.abort(attempt, "bench")
