"""airflow-eos benchmark: one run measures the ceilings, the exactly-once window
end to end through the real operators, and an at-least-once baseline doing the
same work, for windows of several sizes; writes bench/results.md and
bench/results.json.

Starts its own Apache Kafka broker, PostgreSQL (or uses
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
   instances; from their XCom, the stage job's own report separating the
   spark-submit/JVM or session start, and the commit's own seconds; peak RSS of
   the Spark process tree;
3. at-least-once: the same reader, transform (airflow_eos.examples.transforms:orders)
   and Spark, from the consumer group's committed offsets, COPY straight into a
   copy of the target table from the write tasks, then a consumer-group offset
   commit; no ledger, attempt, staging, read reports, checkpoint or publish step.
   On the Spark Connect server (headline) and as a spark-submit of this file
   (``alo-job``) with the stage operator's conf.
   The headline pair (exactly-once partitioned, at-least-once on Spark Connect)
   runs ``--repeats`` times, interleaved; the median run of each is reported.
   The file target (issue 18): ``dags/orders_hourly_files.py`` on the same
   server (FileTarget: the window as a Parquet partition directory), with
   Spark's native Parquet write of the same rows as its ceiling, both
   ``--repeats`` times interleaved (files.py); the Kafka target (issue 19):
   ``dags/orders_to_topic.py`` on the same server (KafkaTarget: the window
   in one producer transaction into a fresh topic), with one transaction of
   a transactional producer producing the same records as its ceiling, both
   ``--repeats`` times interleaved (kafka.py); on the biggest window, the
   Spark side of the window with each reader (Spark's Kafka source and
   eos_kafka) in core-seconds, ``--repeats`` times each (readers.py); the
   Iceberg target (issue 38): ``dags/orders_hourly_iceberg.py`` on the same
   server (IcebergTarget: the window as one append snapshot of a fresh table),
   with a plain pyiceberg append of the same rows as its ceiling, both
   ``--repeats`` times interleaved (iceberg.py); an Avro source (issue 40):
   ``dags/orders_hourly_avro.py`` on the same server over a topic of as many
   Avro records (writer schemas in a schema registry the bench starts),
   interleaved with the JSON window of ``dags/orders_hourly.py``, beside the
   decoder's own ceiling (avro_source.py);

4. CPU: the core-seconds each part of the run (broker, Spark, PostgreSQL,
   this process) spent in each ceiling and window, and what they imply: the
   Spark read's plus the COPY's core-seconds over the cores is a floor under
   any window's time on this machine.

The parts, one module each (beside this file, which is the CLI and composes
them): records.py (the records and shared constants), measure.py (CpuMeter,
TreeMemory, the median run), ceilings.py (1), windows.py (2, reading each
task's figures from its XCom), files.py (2c, the file target), kafka.py (2d, the Kafka target), iceberg.py
(2g, the Iceberg target), avro_source.py (2h, an Avro source), baseline.py (3, and the ``alo-job`` this file
runs under spark-submit), machine.py and report.py (results.json, results.md).

    make bench SIZES=10000,100000,1000000
    .venv/bin/python bench/run.py --sizes 10000
    .venv/bin/python bench/run.py --sizes 10000 --repeats 1 --only iceberg --out /tmp/out   # §2c and §2g only
    .venv/bin/python bench/run.py --sizes 10000 --repeats 1 --only avro --out /tmp/out      # §2h only
    .venv/bin/python bench/run.py render      # results.md again from results.json + results_notes.md
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

# bench/'s modules, whether this file runs as a script, under spark-submit (alo-job) or is imported.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import measure_load  # noqa: E402
from avro_source import avro_headline, avro_ratios, avro_section, measure_avro  # noqa: E402
from baseline import (  # noqa: E402
    alo_job,
    at_least_once_dag,
    run_at_least_once,
    run_at_least_once_in_airflow,
    run_at_least_once_on_connect,
)
from ceilings import measure_ceilings  # noqa: E402
from files import files_headline, files_ratios, files_section, measure_files  # noqa: E402
from growth import (  # noqa: E402
    growth_headline,
    measure_ledger_growth,
    measure_partition_growth,
    measure_verify,
    verify_ratios,
)
from iceberg import iceberg_headline, iceberg_ratios, iceberg_section, measure_iceberg  # noqa: E402
from kafka import kafka_headline, kafka_ratios, measure_kafka  # noqa: E402
from machine import heavy_processes, machine_info  # noqa: E402
from measure import CpuMeter, checkpoint, median_run  # noqa: E402
from peer import measure_peer, peer_headline, peer_ratios  # noqa: E402
from readers import measure_readers  # noqa: E402
from records import HERE, HOUR, TOPIC, fresh_topic  # noqa: E402
from report import QUIET_LOAD, headline, render, render_markdown, write_results  # noqa: E402
from windows import airflow_env, load_dags, run_exactly_once  # noqa: E402


# Longest wait for a quiet machine before measuring anyway (headline withheld).
QUIET_WAIT_S = 600.0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["alo-job"]:  # under spark-submit: the at-least-once baseline's job
        return alo_job(argv[1:])
    if argv[:1] == ["render"]:
        return render(Path(argv[1]) if len(argv) > 1 else HERE)
    args = parse_args(argv)
    run = start_run(args)
    results = measure(args)
    finish(results, run, args)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
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
    parser.add_argument("--only", choices=tuple(ONLY),
                        help="measure only this section and the ones it is compared with (iceberg: §2c and §2g; "
                             "avro: §2h, which has its JSON window), without waiting for a quiet machine; "
                             "results.md holds those sections")
    args = parser.parse_args(argv)
    args.sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Run:
    """What is known before anything is measured."""

    work: Path
    load_start: tuple[float, float, float]
    busy: list[str]
    measured_at: datetime
    started: float


def start_run(args: argparse.Namespace) -> Run:
    """A work dir with Airflow's home (set before anything imports Airflow), and the machine's load now."""
    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="eos-bench-"))
    airflow_env(work / "airflow-home")
    load = os.getloadavg() if args.only else quiet_load()
    run = Run(work, load, heavy_processes(), datetime.now(timezone.utc), time.perf_counter())
    print(f"bench: sizes {args.sizes}, load average {run.load_start}, work dir {work}", flush=True)
    if run.busy:
        print("bench: other busy processes now (figures will be lower):\n  " + "\n  ".join(run.busy), flush=True)
    return run


def quiet_load(wait_s: float = QUIET_WAIT_S) -> tuple[float, float, float]:
    """The load average once its 1-minute figure is at most QUIET_LOAD, or
    after ``wait_s`` (the run then goes on, and its headline is withheld)."""
    deadline = time.monotonic() + wait_s
    load = os.getloadavg()
    while load[0] > QUIET_LOAD and time.monotonic() < deadline:
        print(f"bench: load average {load[0]:.2f} > {QUIET_LOAD}; waiting for the machine to quiet down", flush=True)
        time.sleep(30)
        load = os.getloadavg()
    return load


@dataclass(frozen=True)
class Bench:
    """The services and settings every window size is measured with."""

    bootstrap: str
    pg_url: str
    connect_url: str
    submit_conn: dict
    connect_conn: dict
    meter: CpuMeter
    admin: object
    dags: dict
    alo_dag: object
    cores: int
    repeats: int
    sizes: tuple[int, ...]
    registry_url: str | None  # the schema registry of §2h


def measure(args: argparse.Namespace) -> dict:
    """Start the broker, PostgreSQL and the Spark Connect server, and measure each size."""
    from airflow_eos.embedded import SparkConnectServer, kafka_service, postgres_service

    results: dict = {"sizes": {}}
    with kafka_service() as kafka, postgres_service() as pg, SparkConnectServer(f"local[{args.cores}]") as connect, \
            registry_if_measured(args) as registry:
        # Started once, like a deployment's server: its JVM start is paid once, not per window.
        results["spark_connect_server_start_s"] = connect.start_seconds
        bench = prepare(args, kafka.address, pg.address, connect, registry, results)
        for k, size in enumerate(args.sizes):
            measure_one = ONLY[args.only] if args.only else measure_size
            results["sizes"][size] = measure_one(bench, k, size, results)
        if args.only:
            return results
        results["growth"] = measure_growth(bench)
        results.update(measure_load(kafka.address, pg.address))  # load.py: 20 pipelines x 24 windows, one ledger
        for f in bench.admin.delete_topics([TOPIC]).values():
            f.result(15)
    return results


def registry_if_measured(args: argparse.Namespace):
    """The schema registry of §2h (Apicurio Registry, in memory), unless ``--only`` leaves §2h out."""
    import contextlib

    from airflow_eos.embedded import schema_registry_service

    return schema_registry_service() if args.only in (None, "avro") else contextlib.nullcontext()


def prepare(args: argparse.Namespace, bootstrap: str, pg_url: str, connect, registry, results: dict) -> Bench:
    """Airflow's connections, database and DAGs; the machine's description into ``results``."""
    from confluent_kafka.admin import AdminClient

    os.environ["AIRFLOW_CONN_KAFKA_DEFAULT"] = json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap, "fetch.wait.max.ms": 10}})
    results["machine"] = machine_info(pg_url)
    meter = CpuMeter(pg_url)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    dags = load_dags()
    return Bench(bootstrap, pg_url, connect.url, {"conn_type": "spark", "host": "local[2]"},
                 {"conn_type": "spark_connect", "host": "127.0.0.1", "port": connect.port},
                 meter, admin, dags, at_least_once_dag(), args.cores, args.repeats, tuple(args.sizes),
                 registry.address if registry else None)


def finish(results: dict, run: Run, args: argparse.Namespace) -> None:
    """The run's context and headline into ``results``; results.json and results.md written."""
    results["load_average"] = {"start": run.load_start, "end": os.getloadavg()}
    results["busy_processes_at_start"] = run.busy
    results["measured_at"] = run.measured_at.isoformat(timespec="seconds")
    results["bench_seconds"] = round(time.perf_counter() - run.started, 1)
    results["note"] = args.note
    if args.only:
        return finish_only(results, args)
    results.update(headline(results))
    results.update(files_headline(results))
    results.update(iceberg_headline(results))
    results.update(avro_headline(results))
    results.update(kafka_headline(results))
    results.update(peer_headline(results))
    results.update(growth_headline(results))
    write_results(results, args.out)
    print(f"\nwritten {args.out / 'results.md'} and {args.out / 'results.json'}")
    print(render_markdown(results))


def finish_only(results: dict, args: argparse.Namespace) -> None:
    """results.json and a results.md of only the sections ``--only`` measured."""
    results.update(files_headline(results))
    results.update(iceberg_headline(results))
    results.update(avro_headline(results))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    page = (f"# bench/run.py --only {args.only} (load average at start {results['load_average']['start'][0]:.2f})\n"
            + files_section(results) + iceberg_section(results) + avro_section(results))
    (args.out / "results.md").write_text(page)
    print(f"\nwritten {args.out / 'results.md'} and {args.out / 'results.json'}")
    print(page)


# --------------------------------------------------------------------------- one window size


def measure_size(bench: Bench, k: int, size: int, results: dict) -> dict:
    """Every measurement of a window of ``size`` records (the ``k``-th size)."""
    print(f"\n== window of {size:,} records", flush=True)
    # One database per way of staging: the same window, each with a ledger of its own.
    modes = (("submit", "connect") + tuple(f"{kind}_{j}" for kind in ("partitioned", "files", "kafka", "iceberg",
                                                                      "avro", "avro_json")
                                           for j in range(bench.repeats))
             + (("warm_up", "ledger_growth") if k == 0 else ())
             + (("readers",) if size == max(bench.sizes) else ()))
    urls = create_databases(bench, {mode: f"bench_{size}_{mode}_{os.getpid()}" for mode in modes})
    ends, produce_s = fresh_topic(bench, size)
    r: dict = {"produce_s": produce_s}
    print(f"   produced in {r['produce_s']:.1f}s", flush=True)
    r.update(measure_ceilings(size, ends, bench.bootstrap, bench.pg_url, urls["connect"], bench.cores, bench.meter))
    run_after = datetime(2026, 4, 1, tzinfo=timezone.utc) + k * HOUR
    if k == 0:
        results["spark_connect_first_window_s"] = warm_up(bench, size, urls["warm_up"], run_after - HOUR / 4)
    r.update(before_and_copying(bench, size, urls, run_after))
    checkpoint(bench.pg_url)
    r["at_least_once_submit"] = run_at_least_once(size, urls["submit"], bench.bootstrap, ends,
                                                  f"alo-{size}-submit-{os.getpid()}")
    print(f"   at-least-once (submit): {r['at_least_once_submit']['wall_s']:.1f}s", flush=True)
    r.update(headline_pair(bench, size, ends, urls, run_after + HOUR / 2))
    r["ratios"] = ratios(r, size, bench.cores)
    r.update(measure_files(bench, size, ends, urls, run_after + HOUR / 2))
    r.update(files_ratios(r))
    r.update(measure_kafka(bench, size, ends, urls, run_after + HOUR / 2))
    r.update(kafka_ratios(r))
    r.update(measure_iceberg(bench, size, urls, run_after + HOUR / 2))
    r.update(iceberg_ratios(r))
    r.update(measure_avro(bench, size, urls, run_after + HOUR / 2, bench.registry_url))
    r.update(avro_ratios(r))
    r.update(measure_peer(bench, size, ends, urls, run_after + HOUR / 2))
    r.update(peer_ratios(r))
    if reported_failure(r, "verify", lambda: measure_verify(bench, size, urls["connect"])):
        r.update(verify_ratios(r))
    if size == max(bench.sizes):  # §2f: both readers' windows, on the run's biggest window only
        reported_failure(r, "readers", lambda: measure_readers(bench, ends, urls["readers"]))
    if k == 0:  # on the smallest window: the ledger's part of plan and commit shows best
        reported_failure(r, "ledger_growth",
                         lambda: measure_ledger_growth(bench, size, urls["ledger_growth"], run_after + HOUR / 2))
    drop_databases(bench, urls)
    return r


def measure_iceberg_only(bench: Bench, k: int, size: int, results: dict) -> dict:
    """``--only iceberg``: of a window of ``size`` records, the file target's
    window (§2c, the Iceberg window's comparison) and the Iceberg target's (§2g)."""
    print(f"\n== window of {size:,} records (iceberg only)", flush=True)
    modes = tuple(f"{kind}_{j}" for kind in ("files", "iceberg") for j in range(bench.repeats))
    urls = create_databases(bench, {mode: f"bench_{size}_{mode}_{os.getpid()}" for mode in modes})
    ends, produce_s = fresh_topic(bench, size)
    r: dict = {"produce_s": produce_s}
    run_after = datetime(2026, 4, 1, tzinfo=timezone.utc) + k * HOUR
    r.update(measure_files(bench, size, ends, urls, run_after + HOUR / 2))
    r.update(measure_iceberg(bench, size, urls, run_after + HOUR / 2))
    r.update(iceberg_ratios(r))
    drop_databases(bench, urls)
    return r


def measure_avro_only(bench: Bench, k: int, size: int, results: dict) -> dict:
    """``--only avro``: of a window of ``size`` records, §2h (the Avro window and the JSON one), after
    the server's cold first window (as in a whole run: neither side pays the server's warm-up)."""
    print(f"\n== window of {size:,} records (avro only)", flush=True)
    modes = tuple(f"{kind}_{j}" for kind in ("avro", "avro_json") for j in range(bench.repeats)) + ("warm_up",)
    urls = create_databases(bench, {mode: f"bench_{size}_{mode}_{os.getpid()}" for mode in modes})
    _, produce_s = fresh_topic(bench, size)
    r: dict = {"produce_s": produce_s}
    run_after = datetime(2026, 4, 1, tzinfo=timezone.utc) + k * HOUR
    if k == 0:
        results["spark_connect_first_window_s"] = warm_up(bench, size, urls["warm_up"], run_after - HOUR / 4)
    r.update(measure_avro(bench, size, urls, run_after + HOUR / 2, bench.registry_url))
    r.update(avro_ratios(r))
    drop_databases(bench, urls)
    return r


# What ``--only`` measures of each size.
ONLY = {"iceberg": measure_iceberg_only, "avro": measure_avro_only}


def measure_growth(bench: Bench) -> dict:
    """§7's plan time against partitions (topics of their own, a database of its own)."""
    print("\n== growth: plan time against partitions", flush=True)
    urls = create_databases(bench, {"growth": f"bench_growth_{os.getpid()}"})
    growth: dict = {}
    try:
        reported_failure(growth, "plan_vs_partitions", lambda: measure_partition_growth(bench, urls["growth"]))
    finally:
        drop_databases(bench, urls)
    return growth


def reported_failure(into: dict, key: str, measure_it) -> bool:
    """``into[key] = measure_it()``; if it fails, its error goes into ``into[key + "_error"]``
    (results.md shows it) instead of losing the rest of the run's figures. True when it succeeded."""
    try:
        into[key] = measure_it()
        return True
    except Exception as exc:  # noqa: BLE001 - reported in the results, not hidden
        into[f"{key}_error"] = f"{type(exc).__name__}: {exc}"
        print(f"   {key} FAILED: {into[key + '_error']}", flush=True)
        return False


def create_databases(bench: Bench, dbnames: dict[str, str]) -> dict[str, str]:
    """A fresh database with the target tables for each mode: its URL, by mode."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    from airflow_eos.examples.transforms import ORDERS_TABLE_DDL, PARTITIONED_ORDERS_TABLE_DDL

    urls = {}
    for mode, dbname in dbnames.items():
        with psycopg.connect(bench.pg_url, autocommit=True) as conn:
            # FORCE: this process's ledger connections may still be idle in it (core.database.reused)
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{dbname}"')
        urls[mode] = make_conninfo(bench.pg_url, dbname=dbname)
        with psycopg.connect(urls[mode], autocommit=True) as conn:
            conn.execute(ORDERS_TABLE_DDL)
            conn.execute(PARTITIONED_ORDERS_TABLE_DDL)
    return urls


def drop_databases(bench: Bench, urls: dict[str, str]) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    for url in urls.values():
        with psycopg.connect(bench.pg_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{conninfo_to_dict(url)["dbname"]}" WITH (FORCE)')


def warm_up(bench: Bench, size: int, url: str, run_after: datetime) -> float:
    """The server's first stage starts its Python daemons (cold); a deployment's
    server is warm after its first window. Measured, reported, not compared."""
    first = run_exactly_once(bench.dags["orders_hourly"], size, url, run_after, bench.connect_conn,
                             "analytics.orders", bench.meter)
    print(f"   first window on the fresh server (cold): {first['window_s']:.1f}s", flush=True)
    return first["window_s"]


def before_and_copying(bench: Bench, size: int, urls: dict[str, str], run_after: datetime) -> dict:
    """§2b (staged by spark-submit) and §2a (on Spark Connect), both publishing by INSERT … SELECT."""
    r = {}
    runs = (("exactly_once_submit", "submit", bench.submit_conn),
            ("exactly_once_insert_select", "connect", bench.connect_conn))
    for i, (key, mode, conn) in enumerate(runs):
        checkpoint(bench.pg_url)
        r[key] = run_exactly_once(bench.dags["orders_hourly"], size, urls[mode], run_after + i * HOUR / 4, conn,
                                  "analytics.orders", bench.meter)
        print(f"   exactly-once ({mode}): {r[key]['window_s']:.1f}s ({r[key]['records_per_s']:,.0f}/s), "
              f"phases { {k: round(v, 2) for k, v in r[key]['phases_s'].items()} }", flush=True)
    return r


def headline_pair(bench: Bench, size: int, ends: dict[int, int], urls: dict[str, str], run_after: datetime) -> dict:
    """The headline pair, interleaved so that a slow minute of the machine falls
    on both sides; each exactly-once run is a new window in a database of its
    own, each baseline run a new table and group. The median run of each."""
    eos_runs, alo_runs, alo_task_runs = [], [], []
    for j in range(bench.repeats):
        repeat_after = run_after + j * HOUR / 16
        checkpoint(bench.pg_url)
        eos_runs.append(run_exactly_once(
            bench.dags["orders_hourly_partitioned"], size, urls[f"partitioned_{j}"], repeat_after,
            bench.connect_conn, "analytics.orders_partitioned", bench.meter))
        checkpoint(bench.pg_url)
        alo_runs.append(run_at_least_once_on_connect(size, urls["connect"], bench.bootstrap, ends,
                                                     f"alo-{size}-connect-{j}-{os.getpid()}", bench.connect_url,
                                                     bench.meter))
        checkpoint(bench.pg_url)
        alo_task_runs.append(run_at_least_once_in_airflow(
            bench.alo_dag, size, urls["connect"], bench.bootstrap, ends, f"alo-{size}-airflow-{j}-{os.getpid()}",
            bench.connect_url, repeat_after))
        print(f"   run {j + 1}/{bench.repeats}: exactly-once (partitioned) {eos_runs[-1]['window_s']:.2f}s, "
              f"phases { {k: round(v, 2) for k, v in eos_runs[-1]['phases_s'].items()} }; "
              f"at-least-once {alo_runs[-1]['wall_s']:.2f}s, as an Airflow task "
              f"{alo_task_runs[-1]['wall_s']:.2f}s", flush=True)
    return {"exactly_once": median_run(eos_runs, "window_s"), "at_least_once": median_run(alo_runs, "wall_s"),
            "at_least_once_airflow": median_run(alo_task_runs, "wall_s")}


def ratios(r: dict, size: int, cores: int) -> dict:
    """What one size's figures say against each other."""
    ceilings = {k: r[k]["records_per_s"] for k in ("ceiling_consume", "ceiling_copy", "ceiling_spark_read")}
    slowest = min(ceilings.values())
    e2e, alo = r["exactly_once"], r["at_least_once"]
    before, alo_before = r["exactly_once_submit"], r["at_least_once_submit"]
    copying = r["exactly_once_insert_select"]
    return {
        "e2e_over_ceiling_submit": before["records_per_s"] / slowest,
        "overhead_vs_at_least_once_submit": before["window_s"] / alo_before["wall_s"] - 1,
        "speedup_connect_over_submit": before["window_s"] / copying["window_s"],
        "speedup_over_before": before["window_s"] / e2e["window_s"],
        "e2e_over_ceiling_insert_select": copying["records_per_s"] / slowest,
        "overhead_vs_at_least_once_insert_select": copying["window_s"] / alo["wall_s"] - 1,
        "commit_speedup_attach_over_insert_select": copying["commit_core_s"] / e2e["commit_core_s"],
        "slowest_ceiling": min(ceilings, key=ceilings.get),
        "e2e_over_ceiling": e2e["records_per_s"] / slowest,
        "e2e_over_at_least_once": e2e["records_per_s"] / alo["records_per_s"],
        "overhead_vs_at_least_once": e2e["window_s"] / alo["wall_s"] - 1,
        "overhead_vs_at_least_once_airflow_task": e2e["window_s"] / r["at_least_once_airflow"]["wall_s"] - 1,
        "commit_share": e2e["phases_s"]["commit"] / e2e["window_s"],
        # What the 0.5 target allows, against what the ceilings' own work takes on these cores.
        "target_window_s": 2 * size / slowest,
        "cpu_floor_window_s": (r["ceiling_spark_read"]["cpu_s"]["ours"] + r["ceiling_copy"]["cpu_s"]["ours"]) / cores,
        # The CPU floor over the window's time: 1.0 = the window does only the read's and the COPY's work.
        "floor_over_window": ((r["ceiling_spark_read"]["cpu_s"]["ours"] + r["ceiling_copy"]["cpu_s"]["ours"]) / cores
                              / e2e["window_s"]),
    }


if __name__ == "__main__":
    sys.exit(main())
