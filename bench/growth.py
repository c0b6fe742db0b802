"""How cost grows (issue 20 part 3), each against one quantity, in the same run:

- plan time against partitions: a topic of 4, 64 and 256 partitions holding the
  same 1M records (bench records.produce: round-robin, one later record per
  partition so the window is closed), each planned by the production plan step
  (``airflow_eos.steps.plan`` with a ``KafkaLog`` and the ledger, as the plan
  operator calls it) for a fresh pipeline, up to MAX_REPEATS (3) times; the median;
- plan and commit time against the ledger's size: the example pipeline
  (dags/orders_hourly.py, replace_window) with 10, 1,000 and 10,000 committed
  windows before the measured one. The windows are seeded with SQL that copies
  what the steps wrote for a real window of the pipeline (every ``eos`` row
  keyed by the window: the window, its ranges, attempts, checkpoint ranges and
  chunks, read ranges; its cuts), each copy moved k hours earlier with its
  offsets set to 0 (the topic's records all lie in the measured window, so the
  earlier windows are empty), then ANALYZE (as autovacuum would have); the
  measured window is then planned, staged and committed for real by
  ``dag.test`` (its ledger rows deleted before each run, so the same window is
  planned again), up to MAX_REPEATS (3) times; the median;
- ``airflow-eos verify`` (the CLI, a subprocess) of the exactly-once window
  (§2a's database) against the consume ceiling.

The file and Kafka targets' windows against their own ceilings are §2c/§2d.
Also the section of results.md that shows them (§7)."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time

from measure import checkpoint, median_run
from records import HOUR, T0, biggest_window, produce
from windows import run_exactly_once

PARTITION_COUNTS = (4, 64, 256)
PARTITION_RECORDS = 1_000_000
LEDGER_SIZES = (10, 1_000, 10_000)
LEDGER_DAG = "orders_hourly"
LEDGER_TABLE = "analytics.orders"
MAX_REPEATS = 3  # runs per point (the median); the bench's --repeats if fewer
# Ledger tables whose rows belong to one window (keyed by pipeline and window_start), parents first.
WINDOW_TABLES = ("windows", "window_ranges", "attempts", "checkpoint_ranges", "checkpoint_chunks", "read_ranges")
# Columns set to 0 in the copies: offsets and record counts of the (empty) earlier windows.
ZEROED = {"offset", "start_offset", "end_offset", "records"}
SHIFTED = {"window_start", "window_end", "at"}


def growth_name(values: list[float], sizes: tuple[int, ...]) -> str:
    """The growth of ``values`` measured at ``sizes``: flat while the biggest is
    within 1.5x of the smallest (or 50 ms); else the exponent k of the fit
    between the ends, named (flat below 0.1, sub-linear, linear, super-linear)."""
    import math

    lo, hi = values[0], values[-1]
    if hi <= 1.5 * lo or hi - lo < 0.05:
        return "flat"
    k = math.log(hi / lo) / math.log(sizes[-1] / sizes[0])
    name = ("flat" if k < 0.1 else "sub-linear" if k < 0.8 else "linear" if k <= 1.2 else "super-linear")
    return f"{name} (∝ n^{k:.2f})"


# --------------------------------------------------------------------------- plan vs partitions


def _plan_once(bootstrap: str, url: str, topic: str, pipeline: str) -> tuple[float, int]:
    from datetime import timedelta

    from airflow_eos import steps
    from airflow_eos.core.ledger import Ledger
    from airflow_eos.core.plan import PlanRequest
    from airflow_eos.core.source import KafkaLog
    from airflow_eos.core.windows import Window

    ledger = Ledger(url)
    ledger.migrate()
    request = PlanRequest(Window(pipeline, T0, T0 + HOUR), (topic,), timedelta(minutes=5))
    started = time.perf_counter()
    with KafkaLog({"bootstrap.servers": bootstrap, "fetch.wait.max.ms": 10}) as log_:
        plan = steps.plan(ledger, log_, request)
    seconds = time.perf_counter() - started
    if plan is None:
        raise RuntimeError(f"plan of {topic} for {pipeline}: window not closed")
    return seconds, plan.max_records


def measure_partition_growth(bench, url: str) -> dict:
    """Plan time of the same 1M records over 4, 64 and 256 partitions."""
    from confluent_kafka.admin import NewTopic

    out = {}
    for n in PARTITION_COUNTS:
        topic = f"orders_growth_p{n}"
        for f in bench.admin.create_topics([NewTopic(topic, n, 1)]).values():
            f.result(30)
        t = time.perf_counter()
        ends = produce(bench.bootstrap, topic, PARTITION_RECORDS, n)
        produce_s = time.perf_counter() - t
        runs = []
        try:
            for j in range(min(bench.repeats, MAX_REPEATS)):
                seconds, records = _plan_once(bench.bootstrap, url, topic, f"growth_p{n}_{j}")
                if records != sum(ends.values()):
                    raise RuntimeError(f"plan of {topic} covers {records} records, expected {sum(ends.values())}")
                runs.append({"plan_s": seconds})
        finally:
            for f in bench.admin.delete_topics([topic]).values():
                f.result(30)
        out[n] = {**median_run(runs, "plan_s"), "produce_s": produce_s}
        print(f"   plan of 1M records in {n} partitions: {out[n]['plan_s']:.3f}s (runs {out[n]['runs']})", flush=True)
    return out


# --------------------------------------------------------------------------- plan and commit vs ledger size


def _columns(conn, table: str) -> list[str]:
    return [c for (c,) in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'eos' AND table_name = %s"
        " ORDER BY ordinal_position", (table,))]


def _copy_expr(column: str) -> str:
    if column in SHIFTED:
        return f'"{column}" - k * interval \'1 hour\''
    if column in ZEROED:
        return "0"
    return f'"{column}"'


def seed_windows(url: str, pipeline: str, first: int, last: int) -> float:
    """Copies ``first``..``last`` of the pipeline's window at T0 (k hours
    earlier each, offsets 0), its cuts too; the seconds it took."""
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        for table in WINDOW_TABLES:
            cols = _columns(conn, table)
            select = ", ".join(_copy_expr(c) for c in cols)
            conn.execute(
                f'INSERT INTO eos."{table}" ({", ".join(chr(34) + c + chr(34) for c in cols)}) '
                f"SELECT {select} FROM eos.\"{table}\" CROSS JOIN generate_series(%s::int, %s::int) AS k "
                "WHERE pipeline = %s AND window_start = %s", (first, last, pipeline, T0))
        cols = _columns(conn, "cuts")
        conn.execute(
            f'INSERT INTO eos.cuts ({", ".join(chr(34) + c + chr(34) for c in cols)}) '
            f"SELECT {', '.join(_copy_expr(c) for c in cols)} FROM eos.cuts CROSS JOIN generate_series(%s::int, %s::int)"
            " AS k WHERE pipeline = %s AND at IN (%s, %s) ON CONFLICT DO NOTHING",
            (first, last, pipeline, T0, T0 + HOUR))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")
    return time.perf_counter() - started


def forget_window(url: str, pipeline: str) -> None:
    """The measured window's ledger rows and published rows gone, so the next run plans it again."""
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM eos.dead_letters WHERE pipeline = %s AND window_start = %s", (pipeline, T0))
        conn.execute("DELETE FROM eos.windows WHERE pipeline = %s AND window_start = %s", (pipeline, T0))
        conn.execute('DELETE FROM eos.cuts WHERE pipeline = %s AND at > %s', (pipeline, T0))
        conn.execute('UPDATE eos.partition_offsets SET "offset" = 0 WHERE pipeline = %s', (pipeline,))
        conn.execute(f"DELETE FROM {LEDGER_TABLE} WHERE eos_pipeline = %s AND eos_window_start = %s", (pipeline, T0))


def committed_windows(url: str, pipeline: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM eos.windows WHERE pipeline = %s AND state = 'committed'",
                            (pipeline,)).fetchone()[0]


def measure_ledger_growth(bench, size: int, url: str, run_after) -> dict:
    """Plan and commit of the example pipeline's window with 10, 1,000, 10,000 committed windows before it."""
    dag = bench.dags[LEDGER_DAG]
    pipeline = LEDGER_DAG
    n_run = 0

    def one_run():
        nonlocal n_run
        checkpoint(bench.pg_url)
        r = run_exactly_once(dag, size, url, run_after + n_run * HOUR / 64, bench.connect_conn, LEDGER_TABLE,
                             bench.meter)
        n_run += 1
        return {"plan_s": r["phases_s"]["plan"], "commit_s": r["commit_core_s"],
                "commit_task_s": r["phases_s"]["commit"], "window_s": r["window_s"]}

    one_run()  # the template: a real window whose ledger rows the seed copies
    out, seeded = {}, 0
    for n in LEDGER_SIZES:
        seed_s = seed_windows(url, pipeline, seeded + 1, n)
        seeded = n
        runs = []
        for _ in range(min(bench.repeats, MAX_REPEATS)):
            forget_window(url, pipeline)
            runs.append(one_run())
        before = committed_windows(url, pipeline) - 1
        if before != n:
            raise RuntimeError(f"ledger holds {before} committed windows before the measured one, expected {n}")
        out[n] = {**median_run(runs, "commit_s"), "plan_runs": [r["plan_s"] for r in runs],
                  "plan_median_s": statistics.median(r["plan_s"] for r in runs), "seed_s": seed_s}
        print(f"   {n:,} committed windows before: plan {out[n]['plan_median_s']:.3f}s, commit "
              f"{out[n]['commit_s']:.3f}s (runs {[round(x, 3) for x in out[n]['runs']]})", flush=True)
    return out


# --------------------------------------------------------------------------- verify


def measure_verify(bench, size: int, url: str) -> dict:
    """``airflow-eos verify`` of the §2a window (pipeline orders_hourly in analytics.orders), as a user runs it."""
    from pathlib import Path

    cli = Path(sys.executable).with_name("airflow-eos")
    checkpoint(bench.pg_url)
    with bench.meter.measure() as cpu:
        done = subprocess.run([str(cli), "verify", "--pipeline", LEDGER_DAG, "--table", LEDGER_TABLE,
                               "--postgres-url", url, "--kafka-bootstrap", bench.bootstrap],
                              capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"airflow-eos verify exited {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    found = re.search(r" in ([0-9.]+)s", done.stdout)
    seconds = float(found.group(1)) if found else cpu.seconds["wall"]
    return {"records": size, "seconds": seconds, "command_s": cpu.seconds["wall"], "records_per_s": size / seconds,
            "cpu_s": cpu.seconds}


def verify_ratios(r: dict) -> dict:
    return {"verify_over_consume_ceiling": r["verify"]["records_per_s"] / r["ceiling_consume"]["records_per_s"]}


# --------------------------------------------------------------------------- results


def growth_headline(results: dict) -> dict:
    """results.json's top-level growth figures."""
    out = {}
    growth = results.get("growth") or {}
    parts = growth.get("plan_vs_partitions")
    if parts:
        out["plan_seconds_256p"] = parts[max(parts, key=int)]["plan_s"]
        out["plan_growth_vs_partitions"] = growth_name([parts[n]["plan_s"] for n in sorted(parts, key=int)],
                                                       tuple(sorted(int(n) for n in parts)))
    ledger = next((r["ledger_growth"] for r in results["sizes"].values() if "ledger_growth" in r), None)
    if ledger:
        keys = sorted(ledger, key=int)
        out["commit_seconds_10k_windows"] = ledger[keys[-1]]["commit_s"]
        out["plan_seconds_10k_windows"] = ledger[keys[-1]]["plan_median_s"]
        sizes = tuple(int(k) for k in keys)
        out["commit_growth_vs_ledger"] = growth_name([ledger[k]["commit_s"] for k in keys], sizes)
        out["plan_growth_vs_ledger"] = growth_name([ledger[k]["plan_median_s"] for k in keys], sizes)
    big = biggest_window(results)
    if "verify" in big:
        out["verify_records_per_s_1m"] = big["verify"]["records_per_s"]
        out["verify_over_consume_ceiling_1m"] = big["verify_over_consume_ceiling"]
    return out


def growth_section(res: dict) -> str:
    """§7, when the run measured growth (an older results.json did not)."""
    from report import _rate, _runs, _secs, _table

    growth = res.get("growth") or {}
    parts = growth.get("plan_vs_partitions")
    ledger_size, ledger = next(((n, r["ledger_growth"]) for n, r in res["sizes"].items() if "ledger_growth" in r),
                               (None, None))
    has_verify = any("verify" in r for r in res["sizes"].values())
    errors = [f"- {key} failed: {err}\n" for key, err in
              [*((k, v) for k, v in growth.items() if k.endswith("_error")),
               *((f"{k} ({n:,} records)", v) for n, r in res["sizes"].items() for k, v in r.items()
                 if k in ("verify_error", "ledger_growth_error"))]]
    if not (parts or ledger or has_verify or errors):
        return ""
    out = ["\n## 7. How cost grows\n\nEach table measured in this run (bench/growth.py); the growth is named from "
           "the ends of the range: flat (the biggest within 1.5× or 50 ms of the smallest), else the exponent k of "
           "time ∝ n^k between them (flat < 0.1 ≤ sub-linear < 0.8 ≤ linear ≤ 1.2 < super-linear).\n"]
    if parts:
        keys = sorted(parts, key=int)
        out += ["\n### Plan time against partitions (1M records, one topic)\n\n"
                "The production plan step (`airflow_eos.steps.plan`: a `KafkaLog` and the ledger, what the plan "
                "operator calls) of the window holding the same 1,000,000 records produced round-robin into a topic "
                "of n partitions, each plan for a fresh pipeline (cuts resolved and frozen, not loaded), "
                f"3 times (fewer if `--repeats` is); the median. Growth: **{res.get('plan_growth_vs_partitions', '–')}**.\n\n",
                "| partitions | plan (median) | every run | per partition | records/partition |\n"
                "|---:|---:|---|---:|---:|\n"]
        out += [f"| {int(n):,} | {_secs(parts[n]['plan_s'])} | {_runs(parts[n]['runs'])} | "
                f"{parts[n]['plan_s'] / int(n) * 1000:.0f} ms | {PARTITION_RECORDS // int(n):,} |\n" for n in keys]
    if ledger:
        keys = sorted(ledger, key=int)
        out += [f"\n### Plan and commit time against the ledger's size (window of {ledger_size:,} records)\n\n"
                "dags/orders_hourly.py (replace_window) through `dag.test` on the Spark Connect server, its window "
                "planned, staged and committed for real with n committed windows of the pipeline before it in the "
                "ledger. The n windows are seeded by SQL copying the ledger rows the steps wrote for a real window "
                "of the pipeline (window, ranges, attempt, checkpoint ranges and chunks, read ranges, cuts), each "
                "copy k hours earlier with offsets 0 (empty windows: the topic's records all lie in the measured "
                "window), then ANALYZE. The measured window's rows are deleted before each run, so each run plans "
                "it again; 3 runs (fewer if `--repeats` is), the median (by commit). Commit = the commit step's own seconds (the "
                "target's transaction: lock, checks, INSERT … SELECT, offsets, mark committed). Growth: plan "
                f"**{res.get('plan_growth_vs_ledger', '–')}**, commit **{res.get('commit_growth_vs_ledger', '–')}**."
                "\n\n| committed windows before | plan task (median) | plan runs | commit (median run) | commit runs "
                "| commit task | seeding |\n|---:|---:|---|---:|---|---:|---:|\n"]
        out += [f"| {int(n):,} | {_secs(ledger[n]['plan_median_s'])} | {_runs(ledger[n]['plan_runs'])} | "
                f"{_secs(ledger[n]['commit_s'])} | {_runs(ledger[n]['runs'])} | {_secs(ledger[n]['commit_task_s'])} | "
                f"{_secs(ledger[n]['seed_s'])} |\n" for n in keys]
    if has_verify:
        head, row = _table(res)
        out += ["\n### `airflow-eos verify` against the consume ceiling\n\n"
                "The CLI as a user runs it (`airflow-eos verify --pipeline orders_hourly --table analytics.orders`, "
                "a subprocess) on §2a's database after its window: every committed window's records read from "
                "Kafka and matched to the published rows by lineage. Its own seconds (what it prints), and the "
                "command's wall time (Python start and imports included).\n\n", head,
                row("verify (its own seconds)", lambda r: _secs(r["verify"]["seconds"])),
                row("… the command's wall time", lambda r: _secs(r["verify"]["command_s"])),
                row("… records/s", lambda r: _rate(r["verify"]["records_per_s"])),
                row("consume ceiling (§1), records/s", lambda r: _rate(r["ceiling_consume"]["records_per_s"])),
                row("**verify / consume ceiling**", lambda r: f"**{r['verify_over_consume_ceiling']:.3f}**")]
    if errors:
        out += ["\n**Failed in this run** (the error, as raised):\n\n", *errors]
    out.append("\n### The other targets against their own ceilings\n\nThe file target's 1M window against Spark's "
               "native Parquet write is §2c; the Kafka target's against one transaction of a transactional producer "
               "is §2d (same run).\n")
    return "".join(out)
