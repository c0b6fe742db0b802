"""Where the exactly-once stage's core-seconds go beyond the at-least-once
baseline's (issue 37): the Spark side of an exactly-once window (run_stage of
the orders transform into PostgreSQL, readers.stage_window) and the baseline's
read, transform and COPY (baseline.at_least_once), of the same records,
alternately, warm.

Core-seconds only (the machine is shared): per part (CpuMeter), per JVM
thread group (/proc/PID/task/*/stat, thread names without their numbers),
and the Python workers' processes (children of the JVM), by worker module.
``--connect``: each run in a session of its own on a warm Spark Connect server
(as the bench's windows), else all in one in-process session. ``--py-spy DIR``:
one more run of each sampled by py-spy (every Python worker; py-spy counts
runnable threads, so its samples are shares, not CPU seconds), as raw stacks
in DIR. ``--steps N``: the plan, prepare and commit steps under cProfile.

    .venv/bin/python bench/profile_overhead.py --connect --size 1000000 --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from baseline import _fresh_alo_table, at_least_once
from measure import CpuMeter, checkpoint
from readers import stage_window
from records import PARTITIONS, TOPIC, produce

TICK = os.sysconf("SC_CLK_TCK")


def _spark_jvm():
    import psutil

    for child in psutil.Process().children():
        if "org.apache.spark" in " ".join(child.cmdline()):
            return child
    raise RuntimeError("no Spark JVM under this process")


def _thread_seconds(pid: int) -> dict[str, float]:
    """The JVM's CPU seconds by thread group (the thread's name, digits dropped)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1: stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        group = re.sub(r"[\d#-]+", "", name).strip() or name
        out[group] = out.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def _worker_seconds(jvm) -> dict[str, float]:
    """CPU seconds of the JVM's Python processes (with their reaped children),
    by what they run (the daemon's worker module; forks share their daemon's)."""
    import psutil

    out: dict[str, float] = {}
    for proc in jvm.children(recursive=True):
        try:
            t = proc.cpu_times()
            what = proc.cmdline()[-1].rsplit(".", 1)[-1]
            if proc.ppid() != jvm.pid:
                what += " (fork)"
            out[what] = out.get(what, 0.0) + t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return out


def _diff(after: dict, before: dict) -> dict:
    return {k: round(v - before.get(k, 0.0), 3) for k, v in after.items() if v - before.get(k, 0.0) > 0.005}


def measured(run, jvm) -> dict:
    """``run()`` with its core-seconds by part, by JVM thread group and by Python worker."""
    threads, workers = _thread_seconds(jvm.pid), _worker_seconds(jvm)
    run_out = run()
    return {**run_out, "jvm_threads": _diff(_thread_seconds(jvm.pid), threads),
            "python_workers": sum(_diff(_worker_seconds(jvm), workers).values()),
            "python_by_module": _diff(_worker_seconds(jvm), workers)}


def baseline_run(spark, url: str, bootstrap: str, ends: dict[int, int], meter: CpuMeter) -> dict:
    _fresh_alo_table(url)
    checkpoint(url)
    with meter.measure() as cpu:
        at_least_once(spark, url, bootstrap, f"alo-{uuid.uuid4().hex[:8]}", ends, "alo", time.perf_counter())
    return {"wall_s": cpu.seconds["wall"], "core_s": cpu.seconds["ours"], "cpu_s": cpu.seconds}


def py_spy(jvm, out: Path, run) -> None:
    """``run()`` with py-spy sampling every Python worker of the JVM (the daemons and their forks)."""
    import psutil

    spies = []
    for proc in jvm.children():
        try:
            if "python" not in proc.name():
                continue
        except psutil.Error:
            continue
        spies.append(subprocess.Popen(
            [str(Path(sys.executable).with_name("py-spy")), "record", "--subprocesses", "--nonblocking",
             "-r", "200", "-f", "raw", "-o", str(out.with_suffix(f".{proc.pid}.txt")), "-p", str(proc.pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # py-spy attaching
    try:
        run()
    finally:
        for spy in spies:
            spy.send_signal(2)
        for spy in spies:
            spy.wait(30)


def profile_runs(args, remote: str | None, url: str, bootstrap: str, ends: dict[int, int], meter: CpuMeter,
                 results: dict) -> None:
    """The warm-up, then ``args.repeats`` runs of each kind, alternately; each
    run in a session of its own on ``remote``, else all in one local session."""
    from airflow_eos.spark import spark_session, stop_session

    local = None if remote else spark_session("eos-profile-overhead", master="local[2]")

    def in_session(work):
        spark = local or spark_session("eos-profile-overhead", remote=remote)
        try:
            return work(spark)
        finally:
            if remote:
                stop_session(spark)

    def eo(k):
        return lambda: in_session(lambda spark: stage_window(spark, "python", url, bootstrap, ends, k, meter))

    def alo():
        return in_session(lambda spark: baseline_run(spark, url, bootstrap, ends, meter))

    try:
        jvm = _spark_jvm()
        eo(100)()
        alo()  # warm: workers, imports, JIT
        for k in range(args.repeats):
            for kind, run in (("exactly_once", eo(k)), ("at_least_once", alo)):
                r = {"kind": kind, **measured(run, jvm)}
                results["runs"].append(r)
                print(f"{kind}: {r['core_s']:.2f} core-s, spark {r['cpu_s']['spark']:.2f} "
                      f"(python workers {r['python_workers']:.2f}), postgres {r['cpu_s']['postgres']:.2f}, "
                      f"bench {r['cpu_s']['bench']:.2f}", flush=True)
        if args.steps:
            results["steps"] = [in_session(lambda spark, j=j: profile_steps(spark, url, bootstrap, ends, j))
                                for j in range(args.steps)]
        if args.py_spy:
            Path(args.py_spy).mkdir(parents=True, exist_ok=True)
            py_spy(jvm, Path(args.py_spy) / "exactly_once", eo(200))
            py_spy(jvm, Path(args.py_spy) / "at_least_once", alo)
    finally:
        if local is not None:
            stop_session(local)


def profile_steps(spark, url: str, bootstrap: str, ends: dict[int, int], k: int) -> dict:
    """The work of the Airflow process's plan and commit (and prepare, the
    sensor's) on a partitioned target, each under cProfile: process CPU
    seconds, SQL statements sent, and the functions that took the time."""
    import cProfile
    import io
    import pstats

    import psycopg
    from records import HOUR, T0

    from airflow_eos import PostgresTarget, steps
    from airflow_eos.core.ledger import Ledger
    from airflow_eos.core.plan import PlanRequest
    from airflow_eos.core.source import KafkaLog
    from airflow_eos.core.windows import Window
    from airflow_eos.examples.transforms import PARTITIONED_ORDERS_TABLE_DDL
    from airflow_eos.spark import run_stage

    table = f"analytics.orders_steps_{k}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PARTITIONED_ORDERS_TABLE_DDL.replace("analytics.orders_partitioned", table))
    ledger = Ledger(url)
    ledger.migrate()
    sink = PostgresTarget(url, table, mode="partition_per_window").sink()
    request = PlanRequest(Window(f"steps_{k}", T0, T0 + HOUR), (TOPIC,), dag_id="profile", target_id=table)
    out = {}

    def profiled(name, work):
        profile = cProfile.Profile()
        cpu = time.process_time()
        result = profile.runcall(work)
        out[name] = {"cpu_s": time.process_time() - cpu}
        stats = pstats.Stats(profile)
        out[name]["sql"] = sum(v[1] for f, v in stats.stats.items()
                               if f[2] in ("execute", "executemany") and "psycopg" in f[0])
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
        out[name]["top"] = text.getvalue()
        return result

    def plan():
        with KafkaLog({"bootstrap.servers": bootstrap}) as kafka_log:
            return steps.plan(ledger, kafka_log, request)

    window_plan = profiled("plan", plan)
    attempt = sink.begin(window_plan.window)
    run_stage(spark, window_plan, attempt, sink, {"bootstrap.servers": bootstrap},
              "airflow_eos.examples.transforms:orders", max_bad_records=sum(ends.values()))
    profiled("prepare", lambda: steps.prepare(sink, attempt))
    profiled("commit", lambda: steps.commit(sink, attempt))
    for name, r in out.items():
        print(f"{name}: {r['cpu_s']:.3f} CPU-s, {r['sql']} SQL statements", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--py-spy", default=None, help="also sample one run of each with py-spy into this dir")
    parser.add_argument("--steps", type=int, default=0, help="cProfile the plan and commit steps this many times")
    parser.add_argument("--connect", action="store_true", help="on a Spark Connect server, as the bench's windows")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("airflow_eos").setLevel(logging.WARNING)
    from confluent_kafka.admin import AdminClient, NewTopic

    from airflow_eos.embedded import kafka_service, postgres_service
    from airflow_eos.embedded.spark_connect import SparkConnectServer

    results: dict = {"size": args.size, "load_at_start": os.getloadavg(), "runs": []}
    with kafka_service() as kafka, postgres_service() as pg:
        meter = CpuMeter(pg.address)
        import psycopg

        from airflow_eos.examples.transforms import ORDERS_TABLE_DDL

        with psycopg.connect(pg.address, autocommit=True) as conn:
            conn.execute(ORDERS_TABLE_DDL)  # the baseline's table is LIKE it
        admin = AdminClient({"bootstrap.servers": kafka.address})
        for f in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
            f.result(15)
        ends = produce(kafka.address, TOPIC, args.size, PARTITIONS)
        with contextlib.ExitStack() as stack:
            remote = stack.enter_context(SparkConnectServer("local[2]")).url if args.connect else None
            profile_runs(args, remote, pg.address, kafka.address, ends, meter, results)
    summarize(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    return 0


def summarize(results: dict) -> None:
    """Medians per kind: parts, Python workers, JVM thread groups."""
    for kind in ("exactly_once", "at_least_once"):
        runs = [r for r in results["runs"] if r["kind"] == kind]
        med = {p: statistics.median(r["cpu_s"][p] for r in runs) for p in ("ours", "spark", "postgres", "bench")}
        med["python_workers"] = statistics.median(r["python_workers"] for r in runs)
        groups = sorted({g for r in runs for g in r["jvm_threads"]})
        threads = {g: statistics.median(r["jvm_threads"].get(g, 0.0) for r in runs) for g in groups}
        results[kind] = {**med, "jvm_threads": threads, "min_ours": min(r["cpu_s"]["ours"] for r in runs)}
        print(f"{kind} medians: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
        print("  jvm threads: " + ", ".join(f"{g} {v:.2f}" for g, v in sorted(threads.items(), key=lambda x: -x[1])
                                            if v >= 0.02))


if __name__ == "__main__":
    sys.exit(main())
