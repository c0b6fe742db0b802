"""The peer (issue 20 part 1): the pipeline an Airflow user builds today with
the Apache Kafka provider, on the same records and the same PostgreSQL as the
headline window, run by ``dag.test`` in the same bench run.

One ``ConsumeFromTopicOperator`` (apache-airflow-providers-apache-kafka) reads
the topic to its end through a consumer group of its own (subscribe, read from
the earliest offset, ``enable.auto.commit`` false as the provider's docs ask,
``commit_cadence="end_of_operator"``: one offset commit when the operator is
done). Its ``apply_function_batch`` gets each batch of ``max_batch_size``
messages, parses each value with ``json.loads``, keeps the records of the data
interval (the topic also holds one later record per partition, as for the
window) and COPYs the batch's rows (psycopg 3, ``write_row``) into a table of
the orders table's columns over one connection the task keeps open, committing
after each batch: the apply function has no hook at the operator's end, so a
batch is durable when its function returns. The table has no unique index
(with the window's lineage key a retry of the peer could not write at all);
it is told how many records the topic holds (``max_messages``), so it never
waits ``poll_timeout`` at the end of the log (the best case: with
``max_messages=None`` the operator ends only after ``poll_timeout`` without a
message, which must exceed the group's join, ~3 s). The Kafka client is tuned as the window's reader is
(``fetch.wait.max.ms`` 10, ``fetch.queue.backoff.ms`` 10).

Its window time is the task's start to end (the exactly-once window's is plan
start to commit end). Also one run killed in the middle: the apply function
raises after half the batches in the task's first try (what a worker lost
mid-task leaves: the batches written, no offsets committed), the task retries
and reads everything again; the duplicate rows the table then holds are
counted by the records' (partition, offset). Also the section of results.md
that shows them (§2e)."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

from measure import checkpoint, median_run
from records import HOUR, T0, TARGET_COLUMNS, TOPIC, biggest_window

DAG_ID = "bench_peer_consume_operator"
PEER_TABLE = "analytics.orders_peer"
PEER_CONN_ID = "kafka_peer"
BATCH_SIZE = 20_000  # max_batch_size, tuned on the 1M window (see the section's note)
# Long enough for the group's join (~3 s: the broker's initial rebalance delay, as Kafka's default).
POLL_TIMEOUT_S = 10.0
MAX_REPEATS = 3  # runs of the peer per size (the median); the bench's --repeats if fewer
# What the apply function needs that a user's DAG would name in its code: the database, and when to fail (kill run).
_PEER_TASK: dict = {}


class PeerKilled(RuntimeError):
    """Raised by the apply function in the kill run: the task dies mid-way, its batches so far written."""


def write_batch(messages, *, window_start: str, window_end: str, try_number: str) -> None:
    """The peer's ``apply_function_batch``: parse, keep the interval's records, COPY, commit."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    conn = _PEER_TASK.get("conn")
    if conn is None or conn.closed:
        conn = _PEER_TASK["conn"] = psycopg.connect(_PEER_TASK["url"])
        _PEER_TASK["dbname"] = conninfo_to_dict(_PEER_TASK["url"])["dbname"]
    kill_after = _PEER_TASK.get("kill_after_batches")
    batches = _PEER_TASK.setdefault("batches", {})
    batches[try_number] = batches.get(try_number, 0) + 1
    if kill_after is not None and try_number == "1" and batches[try_number] > kill_after:
        raise PeerKilled(f"killed after {kill_after} batches")
    start_ms, end_ms = _ms(window_start), _ms(window_end)
    with conn.cursor() as cur, cur.copy(f"COPY {PEER_TABLE} ({', '.join(TARGET_COLUMNS)}) FROM STDIN") as copy:
        for m in messages:
            if m.error() is not None:
                raise RuntimeError(f"consume error: {m.error()}")
            ts = m.timestamp()[1]
            if not start_ms <= ts < end_ms:
                continue
            order = json.loads(m.value())
            copy.write_row((order["order_id"], order["customer"], order["amount"], m.topic(), m.partition(),
                            m.offset(), "peer", window_start))
    conn.commit()


def _ms(iso: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def peer_dag(max_messages: int):
    """The peer DAG reading ``max_messages`` (every record in the topic), serialized
    as baseline.at_least_once_dag does (it is in no DAG file)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.providers.apache.kafka.operators.consume import ConsumeFromTopicOperator
    from airflow.sdk import DAG
    from airflow.timetables.interval import CronDataIntervalTimetable

    # Hourly data intervals, as the example DAGs: logical date T0 + 1h runs the interval [T0, T0 + 1h).
    with DAG(DAG_ID, schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"), start_date=T0,
             catchup=False) as dag:
        ConsumeFromTopicOperator(
            task_id="consume_to_postgres",
            kafka_config_id=PEER_CONN_ID,
            topics=[TOPIC],
            apply_function_batch=write_batch,
            apply_function_kwargs={"window_start": "{{ data_interval_start }}",
                                   "window_end": "{{ data_interval_end }}",
                                   "try_number": "{{ ti.try_number }}"},
            commit_cadence="end_of_operator",
            max_batch_size=BATCH_SIZE,
            max_messages=max_messages,
            poll_timeout=POLL_TIMEOUT_S,
            retries=1,
            retry_delay=timedelta(0),
        )
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder=os.devnull)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)
    return dag


def _fresh_peer_table(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {PEER_TABLE}")
        conn.execute(f"CREATE TABLE {PEER_TABLE} (LIKE analytics.orders INCLUDING DEFAULTS)")


def _lineage_counts(url: str) -> tuple[int, int]:
    """Rows in the peer's table, and distinct (partition, offset) among them."""
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(f"SELECT count(*), count(DISTINCT (eos_partition, eos_offset)) FROM {PEER_TABLE}"
                            ).fetchone()


def run_peer(dag, bench, size: int, url: str, run_after, group: str, kill_after_batches: int | None = None) -> dict:
    """One run of the peer DAG by dag.test into a fresh table: its figures, and what the table holds."""
    os.environ[f"AIRFLOW_CONN_{PEER_CONN_ID.upper()}"] = json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": bench.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": "false", "fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 10,
        # 6 s, Kafka's minimum: a killed peer's member leaves the group soon (the default is 45 s).
        "session.timeout.ms": 6000}})
    _fresh_peer_table(url)
    _PEER_TASK.clear()
    _PEER_TASK.update(url=url, kill_after_batches=kill_after_batches)
    try:
        with bench.meter.measure() as cpu:
            run = dag.test(logical_date=T0 + HOUR, run_after=run_after)
    finally:
        conn = _PEER_TASK.pop("conn", None)
        if conn is not None:
            conn.close()
    [ti] = run.get_task_instances()
    if run.state != "success":
        raise RuntimeError(f"peer run of {size} failed: {ti.state}")
    rows, distinct = _lineage_counts(url)
    task_s = (ti.end_date - ti.start_date).total_seconds()
    return {"records": size, "window_s": task_s, "records_per_s": size / task_s, "rows": rows,
            "distinct_records": distinct, "duplicates": rows - distinct, "missing": size - distinct,
            "tries": ti.try_number, "batches_by_try": dict(_PEER_TASK.get("batches", {})), "cpu_s": cpu.seconds}


def measure_peer(bench, size: int, ends: dict[int, int], urls: dict[str, str], run_after) -> dict:
    """§2e of one size: the peer up to MAX_REPEATS times (each a fresh table and
    group), then one run killed after half its batches and retried."""
    dag = peer_dag(sum(ends.values()) + len(ends))  # the window's records and one later record per partition
    url = urls["connect"]
    runs = []
    for j in range(min(bench.repeats, MAX_REPEATS)):
        checkpoint(bench.pg_url)
        r = run_peer(dag, bench, size, url, run_after + j * HOUR / 16, f"peer-{size}-{j}-{os.getpid()}")
        if r["rows"] != size or r["duplicates"] or r["missing"]:
            raise RuntimeError(f"peer run of {size} wrote {r['rows']} rows ({r['duplicates']} duplicate, "
                               f"{r['missing']} missing), expected {size} once each")
        runs.append(r)
        print(f"   run {j + 1}: peer (ConsumeFromTopicOperator) {r['window_s']:.2f}s", flush=True)
    half = -(-size // BATCH_SIZE) // 2
    if half < 1:  # one batch holds the whole window: nothing to kill in the middle of
        _fresh_peer_table(url)
        return {"peer": median_run(runs, "window_s"), "peer_killed": None}
    checkpoint(bench.pg_url)
    started = time.perf_counter()
    killed = run_peer(dag, bench, size, url, run_after + MAX_REPEATS * HOUR / 16,
                      f"peer-{size}-killed-{os.getpid()}", kill_after_batches=half)
    killed["dag_test_wall_s"] = time.perf_counter() - started
    killed["killed_after_batches"] = half
    if killed["tries"] != 2 or killed["batches_by_try"].get("1") != half + 1:
        raise RuntimeError(f"the peer's killed run did not die after {half} batches and retry once: {killed}")
    print(f"   peer killed after {half} batches and retried: {killed['rows']:,} rows, "
          f"{killed['duplicates']:,} duplicates, {killed['missing']:,} missing", flush=True)
    _fresh_peer_table(url)
    return {"peer": median_run(runs, "window_s"), "peer_killed": killed}


def peer_ratios(r: dict) -> dict:
    """One size's peer against the headline window (§2)."""
    peer, eos = r["peer"], r["exactly_once"]
    return {"peer_window_s": peer["window_s"], "peer_speedup": peer["window_s"] / eos["window_s"],
            "peer_duplicates_after_kill": (r["peer_killed"] or {}).get("duplicates")}


def peer_headline(results: dict) -> dict:
    """results.json's top-level peer figures, of the biggest window."""
    big = biggest_window(results)
    if "peer_speedup" not in big:
        return {}
    return {"peer_window_1m_seconds": big["peer_window_s"], "peer_speedup_1m": big["peer_speedup"],
            "peer_duplicates_after_kill_1m": big["peer_duplicates_after_kill"]}


# --------------------------------------------------------------------------- results.md §2e


def peer_section(res: dict) -> str:
    """§2e, when the run measured the peer (an older results.json did not)."""
    from report import _runs, _secs, _table

    if not any("peer" in r for r in res["sizes"].values()):
        return ""
    head, row = _table(res)

    def p(r):
        return r["peer"]

    def k(r):
        return r["peer_killed"]

    return "".join([
        "\n## 2e. The peer: what an Airflow user builds today (one `ConsumeFromTopicOperator`)\n\n",
        "The same records into a table of the same columns, the way the Apache Kafka provider "
        "(apache-airflow-providers-apache-kafka 2.1.0) offers it, run by `dag.test` in this run (bench/peer.py):\n\n",
        "```python\n",
        "ConsumeFromTopicOperator(\n",
        f"    task_id=\"consume_to_postgres\", kafka_config_id=\"{PEER_CONN_ID}\", topics=[\"{TOPIC}\"],\n",
        "    apply_function_batch=write_batch,   # json.loads each value, keep the data interval's records,\n",
        "                                        # COPY the batch (psycopg 3 write_row), commit\n",
        "    apply_function_kwargs={\"window_start\": \"{{ data_interval_start }}\", \"window_end\": \"{{ data_interval_end }}\", ...},\n",
        f"    commit_cadence=\"end_of_operator\", max_batch_size={BATCH_SIZE:_},\n",
        f"    max_messages=<the records in the topic>, poll_timeout={POLL_TIMEOUT_S:g},\n",
        "    retries=1)\n",
        "```\n\n",
        "Its connection: a consumer group of its own per run, `auto.offset.reset` earliest, `enable.auto.commit` "
        "false (the provider's docs ask for it with a commit cadence), `fetch.wait.max.ms` and "
        "`fetch.queue.backoff.ms` 10 (as the window's reader), `session.timeout.ms` 6000 (Kafka's minimum: "
        "the killed peer's member leaves the group soon). One PostgreSQL connection kept open by the task; "
        "each batch is COPYed and committed when the function returns (the function has no hook at the "
        "operator's end, so this is where a batch becomes durable). The table has the orders table's columns "
        "and no unique index (with the window's lineage key, a retry of the peer could not write at all); the "
        "operator is given `max_messages` = the records in the topic, so it stops at the log's end without "
        "waiting `poll_timeout` (the best case for it: without it, the operator ends only after `poll_timeout` "
        "without a message, which must exceed the group's join, ~3 s here as on Kafka with its default initial "
        "rebalance delay). Its time is the task's start to end. Every run "
        "is checked: the table holds each record once. The killed run: the apply function raises in the "
        "first try after half the batches (what a worker lost mid-task leaves: those batches committed in "
        "PostgreSQL, no offset committed in Kafka); the task's retry reads the topic again from the start.\n\n",
        head,
        row("peer task time (the median of up to 3 runs)", lambda r: _secs(p(r)["window_s"])),
        row("… every run, in order", lambda r: _runs(p(r)["runs"])),
        row("… records/s", lambda r: f"{p(r)['records_per_s']:,.0f}/s"),
        row("exactly-once window (§2, partition attach), median", lambda r: _secs(r["exactly_once"]["window_s"])),
        row("**peer time / exactly-once window time**", lambda r: f"**{r['peer_speedup']:.2f}×**"),
        row("core-seconds of the peer run (ours)", lambda r: f"{p(r)['cpu_s']['ours']:.1f}"),
        row("killed run: batches written before the kill", lambda r: f"{k(r)['killed_after_batches']:,}"),
        row("killed run: rows in the table after the retry", lambda r: f"{k(r)['rows']:,}"),
        row("**killed run: duplicate rows left (same partition and offset)**",
            lambda r: f"**{k(r)['duplicates']:,}**"),
        row("killed run: records missing", lambda r: f"{k(r)['missing']:,}"),
        row("killed run: dag.test, both tries", lambda r: _secs(k(r)["dag_test_wall_s"])),
    ])
