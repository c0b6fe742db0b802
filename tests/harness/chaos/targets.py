"""Per target: what is left of a pipeline's attempts (staging), and the target read
as its readers read it, by lineage, against the source's records.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import psycopg

from airflow_eos.core.windows import Window, to_utc
from airflow_eos.targets.files.identity import ROOT_CLAIM
from airflow_eos.targets.files.storage import files_for
from airflow_eos.targets.files.writer import COMMIT_FILE, STAGING_DIR, TRASH_DIR
from airflow_eos.targets.postgres.target import STAGING_SCHEMA
from harness.chaos.pipeline import Pipeline
from harness.chaos.source import kafka_records

# --------------------------------------------------------------------------- per target: leftovers, readers


def _postgres_leftovers(p: Pipeline, conn: psycopg.Connection) -> list[str]:
    """Staging tables of the pipeline's attempts still in the staging schema."""
    stagings = [r[0] for r in conn.execute("SELECT staging_table FROM eos.attempts WHERE pipeline = %s", (p.name,))]
    return [f"{STAGING_SCHEMA}.{r[0]}" for r in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename = ANY(%s)", (STAGING_SCHEMA, stagings))]


def _file_leftovers(p: Pipeline, conn: psycopg.Connection) -> list[str]:
    """Anything in the root's staging (the root is the pipeline's alone), a
    temporary file anywhere, a publication decided but never finished, and in
    the trash anything but a replaced window's whole old version (kept for its
    retention, for readers still listing it: an older epoch than the window's
    committed one, every file of its commit file there)."""
    root = p.root or ""
    store = files_for(root)
    left = []
    if store.is_dir(f"{root}/{STAGING_DIR}"):
        left += [f"{STAGING_DIR}/{e.name}" for e in store.entries(f"{root}/{STAGING_DIR}")]
    committed = {ws: epoch for ws, epoch in conn.execute(
        "SELECT window_start, committed_epoch FROM eos.windows WHERE pipeline = %s AND state = 'committed'",
        (p.name,))}
    trash = f"{root}/{TRASH_DIR}"
    for kept in [e.name for e in store.entries(trash)] if store.is_dir(trash) else ():
        doc = f"{trash}/{kept}/{COMMIT_FILE}"
        old = json.loads(store.read_bytes(doc)) if store.is_file(doc) else {}
        whole = {f["name"] for f in old.get("files", ())} | {COMMIT_FILE} == {
            e.name for e in store.entries(f"{trash}/{kept}")}
        window = datetime.fromisoformat(old["window_start"]) if "window_start" in old else None
        if not (old.get("pipeline") == p.name and old.get("epoch", 1 << 62) < committed.get(window, 0) and whole):
            left.append(f"{TRASH_DIR}/{kept} (not a whole old version of a replaced window)")
    for directory, dirs, files in store.walk(root):
        dirs[:] = [d for d in dirs if d not in (STAGING_DIR, TRASH_DIR)]
        kept = {COMMIT_FILE} | ({ROOT_CLAIM} if directory == root else set())  # the root's claim: at its top
        left += [os.path.relpath(os.path.join(directory, f), root) for f in files
                 if f.startswith(".") or (f.startswith("_") and f not in kept)]
    left += [f"publication of attempt {epoch} of window {ws.isoformat()} decided, never finished"
             for ws, epoch in conn.execute("SELECT window_start, epoch FROM eos.publications WHERE pipeline = %s"
                                           " AND state = 'decided'", (p.name,))]
    return left


SETTLE_S = 5


def _partition_ends(kafka_config: Mapping[str, Any], topic: str, isolation: str) -> dict[int, int]:
    """partition -> the offset where a reader with ``isolation`` reaches the
    partition's end (read from the start: never the reported high watermark)."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    consumer = Consumer({**kafka_config, "group.id": "eos-chaos-ends", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": isolation})
    try:
        partitions = consumer.list_topics(topic, timeout=15).topics[topic].partitions
        consumer.assign([KafkaTopicPartition(topic, n, 0) for n in partitions])
        ends: dict[int, int] = {}
        deadline = time.monotonic() + 30
        while len(ends) < len(partitions):
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic} to its end ({isolation}) took more than 30 s")
            msg = consumer.poll(0.5)
            if msg is not None and msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"reading {topic}: {msg.error()}")
                ends[msg.partition()] = msg.offset()
    finally:
        consumer.close()
    return ends


def _settled_ends(kafka_config: Mapping[str, Any], topic: str) -> tuple[dict[int, int], dict[int, int]]:
    """Where read_committed and read_uncommitted readers reach each partition's
    end, read until they agree or for SETTLE_S. A committed transaction's
    markers are written after the producer's commit returns (the coordinator
    answers once the commit is in its own log), so the two may differ for a
    moment after the last commit; a transaction left open holds them apart
    until the broker's transaction timeout (a minute), far longer."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        committed = _partition_ends(kafka_config, topic, "read_committed")
        written = _partition_ends(kafka_config, topic, "read_uncommitted")
        if committed == written or time.monotonic() > deadline:
            return committed, written
        time.sleep(0.5)


def _kafka_leftovers(p: Pipeline, conn: psycopg.Connection) -> list[str]:
    """The staging tables (the PostgreSQL target's), and a transaction left
    open in the target topic: where one is, a read_committed reader reaches
    the partition's end at it (the last stable offset), before the log's end."""
    topic = p.target_topic or ""
    committed, written = _settled_ends(p.kafka_config, topic)
    return _postgres_leftovers(p, conn) + [
        f"a transaction left open in {topic}[{n}]: read_committed readers end at {committed.get(n)}, its log at "
        f"{end}; there: {_record_headers(p.kafka_config, topic, n, committed.get(n) or 0)}"
        for n, end in sorted(written.items()) if committed.get(n) != end]


def _record_headers(kafka_config: Mapping[str, Any], topic: str, partition: int, offset: int) -> dict | None:
    """The lineage headers of the first record at or after ``offset`` (read_uncommitted)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    consumer = Consumer({**kafka_config, "group.id": "eos-chaos-ends", "enable.auto.commit": False,
                         "isolation.level": "read_uncommitted"})
    try:
        consumer.assign([KafkaTopicPartition(topic, partition, offset)])
        msg = consumer.poll(10)
        if msg is None or msg.error():
            return None
        return {"offset": msg.offset(), **{k: v.decode() for k, v in msg.headers() or []
                                            if k in ("eos-window-start", "eos-epoch", "eos-commit")}}
    finally:
        consumer.close()


def _iceberg_leftovers(p: Pipeline, conn: psycopg.Connection) -> list[str]:
    """Under the table's attempt folders: the folder of any attempt not
    committed, a temporary file, a dead letters' file, a data file of a
    committed attempt that its manifest does not name; a publication decided
    and never finished."""
    sink = p.target
    store = sink.store  # type: ignore[attr-defined]
    states = dict(conn.execute("SELECT staging_table, state FROM eos.attempts WHERE pipeline = %s", (p.name,)))
    left = []
    for name in store.subdirectories(sink.eos_root):  # type: ignore[attr-defined]
        url = sink.attempt_url(name)  # type: ignore[attr-defined]
        if states.get(name) != "committed":
            left.append(f"{name} (attempt {states.get(name, 'unknown')})")
            continue
        named = {path for (path,) in conn.execute(
            "SELECT s.path FROM eos.staged_files s JOIN eos.attempts a USING (pipeline, window_start, epoch)"
            " WHERE a.staging_table = %s AND s.kind = 'data'", (name,))}
        for folder in store.subdirectories(url):
            for f in store.listing(f"{url}/{folder}"):
                if f"{folder}/{f.name}" not in named:
                    left.append(f"{name}/{folder}/{f.name}")
        hidden = [d for d in ("rows", "dead_letters") if store.subdirectories(f"{url}/{d}")]
        left += [f"{name}/{d}/ holds a directory" for d in hidden]
    left += [f"publication of attempt {epoch} of window {ws.isoformat()} decided, never finished"
             for ws, epoch in conn.execute("SELECT window_start, epoch FROM eos.publications WHERE pipeline = %s"
                                           " AND state = 'decided'", (p.name,))]
    return left


# How each target keeps staging: what is left of the pipeline's attempts.
LEFTOVERS: dict[str, Callable[[Pipeline, psycopg.Connection], list[str]]] = {
    "postgres": _postgres_leftovers,
    "files": _file_leftovers,
    "kafka": _kafka_leftovers,
    "iceberg": _iceberg_leftovers,
}



def parquet_source(root: str) -> dict[str, Any]:
    """How PyArrow reads ``root`` (a local directory, or an hdfs:// URL through
    hdfs-native's fsspec file system): ``pq.read_table(**parquet_source(root))``."""
    if not root.startswith("hdfs://"):
        return {"source": root}
    from urllib.parse import urlsplit

    import pyarrow.fs
    from hdfs_native.fsspec import HdfsFileSystem

    parts = urlsplit(root)
    # Not in fsspec's instance cache: fsspec empties it in every forked child,
    # and a child that drops an hdfs-native client waits forever for its
    # runtime's threads, which a fork does not copy (a test forking later in
    # the same worker hung in os.fork).
    hdfs = HdfsFileSystem(host=parts.hostname, port=parts.port, skip_instance_cache=True)
    return {"source": parts.path, "filesystem": pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(hdfs))}


def _read_parquet_root(root: str):
    """What a reader of the root sees: every visible Parquet file under it,
    Hive-partitioned (PyArrow skips names starting with "_" or ".", as Spark does)."""
    import pyarrow.parquet as pq

    if not any(not e.name.startswith(("_", ".")) for e in files_for(root).entries(root)):
        return []
    return pq.read_table(**parquet_source(root), partitioning="hive").to_pylist()


def _committed_epochs(p: Pipeline, conn: psycopg.Connection) -> dict[datetime, int]:
    return dict(conn.execute("SELECT window_start, committed_epoch FROM eos.windows WHERE pipeline = %s"
                             " AND state = 'committed'", (p.name,)).fetchall())


def _committed_records(p: Pipeline, conn: psycopg.Connection, windows: Sequence[int], committed: Mapping[datetime, int],
                       expect: Callable[[Window, dict], tuple]) -> tuple[dict[tuple[str, int, int], tuple],
                                                                       set[tuple[str, int, int]]]:
    """The Kafka records of the committed windows' frozen ranges, by lineage:
    ``expect(window, order)`` of each well-formed one (what a reader must find
    for it), and the malformed ones (dead letters)."""
    expected: dict[tuple[str, int, int], tuple] = {}
    malformed: set[tuple[str, int, int]] = set()
    for i in windows:
        window = p.window(i)
        plan = p.ledger.load_plan(conn, window)
        if plan is None or window.start not in committed:
            continue  # reported as not committed
        for r in plan.ranges:
            for offset, value in kafka_records(p.kafka_config, r.topic, r.partition, r.start_offset,
                                               r.end_offset).items():
                try:
                    expected[r.topic, r.partition, offset] = expect(window, json.loads(value))
                except (ValueError, TypeError, KeyError):
                    malformed.add((r.topic, r.partition, offset))
    return expected, malformed


def _lineage_problems(read: str, expected: Mapping[tuple[str, int, int], tuple], rows: Sequence[dict]) -> list[str]:
    """Each expected record's lineage on one row, none on no row or another (``read``: how the rows were read)."""
    seen = Counter((r["eos_topic"], r["eos_partition"], r["eos_offset"]) for r in rows)
    duplicates = sorted(k for k, c in seen.items() if c > 1)
    missing = sorted(set(expected) - set(seen))
    extra = sorted(set(seen) - set(expected))
    if duplicates or missing or extra:
        return [f"{read}: {len(duplicates)} duplicate(s) {duplicates[:5]}, "
                f"{len(missing)} missing {missing[:5]}, {len(extra)} extra {extra[:5]}"]
    return []


def _dead_letter_problems(p: Pipeline, conn: psycopg.Connection, malformed: set[tuple[str, int, int]]) -> list[str]:
    """The ledger's dead letters of the pipeline are the malformed records, each once."""
    dead = Counter(conn.execute('SELECT topic, partition, "offset" FROM eos.dead_letters WHERE pipeline = %s',
                                (p.name,)).fetchall())
    if set(dead) != malformed or any(c > 1 for c in dead.values()):
        return [f"dead letters in the ledger {sorted(dead.elements())[:10]} are not the malformed records "
                f"{sorted(malformed)[:10]}, once each"]
    return []


def _file_reader_problems(p: Pipeline, conn: psycopg.Connection, windows: Sequence[int]) -> list[str]:
    """The file target read back as a reader does (PyArrow over the root), by
    lineage, against the Kafka records of the committed windows' frozen
    ranges: each well-formed record once, in its window's partition, with the
    transform's values; each malformed one a dead letter of the ledger, once;
    nothing else. Every partition directory is the window's committed attempt."""
    problems: list[str] = []
    # lineage -> (window start, n)
    committed = _committed_epochs(p, conn)
    expected, malformed = _committed_records(p, conn, windows, committed,
                                             lambda window, order: (window.start.isoformat(), int(order["n"])))
    rows = _read_parquet_root(p.root or "")
    problems += _lineage_problems("the root read with PyArrow", expected, rows)
    wrong = []
    for r in rows:
        lineage = (r["eos_topic"], r["eos_partition"], r["eos_offset"])
        if lineage in expected:
            window_start, n = expected[lineage]
            if (r["id"], _utc_text(r.get("eos_window_start"))) != (n, window_start):
                wrong.append((lineage, r["id"], r.get("eos_window_start")))
    if wrong:
        problems.append(f"{len(wrong)} row(s) with another id or window than their record's: {wrong[:5]}")
    problems += _dead_letter_problems(p, conn, malformed)
    sink = p.target
    for directory, doc in sink.published_partitions(p.name):  # type: ignore[attr-defined]
        start = datetime.fromisoformat(doc["window_start"])
        if committed.get(start) != doc["epoch"]:
            problems.append(f"{directory} holds attempt {doc['epoch']}, the ledger committed "
                            f"{committed.get(start)}")
    return problems


def _utc_text(value: Any) -> str | None:
    """A Hive partition value of a window start, as the ISO text of its instant."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(timezone.utc).isoformat()


def _kafka_reader_problems(p: Pipeline, conn: psycopg.Connection, windows: Sequence[int]) -> list[str]:
    """The target topic read as a read_committed consumer reads it, to its
    end (a transaction left open is a leftover: :func:`_kafka_leftovers`),
    keeping the records of the transactions the ledger names as committed
    (Apache Kafka hides aborted ones; a Kafka-compatible broker may not).
    Verify checks their lineage against Kafka;
    here each record's content: key = the order's id, value = its amount, the
    window and epoch headers those of its source record's committed window."""
    problems: list[str] = []
    committed = {to_utc(ws).isoformat(): (epoch, int(token)) for ws, epoch, token in conn.execute(
        "SELECT window_start, epoch, token FROM eos.kafka_commits WHERE pipeline = %s", (p.name,))}
    expected: dict[tuple[str, int, int], tuple[str, bytes, bytes]] = {}  # lineage -> (window start, key, value)
    for i in windows:
        window = p.window(i)
        plan = p.ledger.load_plan(conn, window)
        if plan is None:
            continue  # reported as not committed
        for r in plan.ranges:
            for offset, value in kafka_records(p.kafka_config, r.topic, r.partition, r.start_offset,
                                               r.end_offset).items():
                try:
                    order = json.loads(value)
                    n, amount = int(order["n"]), Decimal(order["amount"])
                except (ValueError, TypeError, KeyError):
                    continue  # a dead letter: verify checks it
                expected[r.topic, r.partition, offset] = (window.start.isoformat(), str(n).encode(),
                                                          str(amount).encode())
    sink = p.target
    records = sink.published_records(p.name, committed_only={(ws, token) for ws, (_, token) in committed.items()})
    wrong = []
    for r in records:
        h = r["headers"]
        lineage = (h.get("eos-topic"), int(h.get("eos-partition", -1)), int(h.get("eos-offset", -1)))
        want = expected.get(lineage)
        if want is None:
            continue  # extra: verify reports it
        window_start, key, value = want
        if (h["eos-window-start"], r["key"], r["value"]) != (window_start, key, value) \
                or int(h["eos-epoch"]) != committed[window_start][0]:
            wrong.append((lineage, r["key"], r["value"], h["eos-window-start"], h["eos-epoch"]))
    if wrong:
        problems.append(f"{len(wrong)} record(s) of topic {sink.topic} with another key, value, window or epoch "
                        f"than their source record's committed window: {wrong[:5]}")
    return problems


def _iceberg_reader_problems(p: Pipeline, conn: psycopg.Connection, windows: Sequence[int]) -> list[str]:
    """The table read as its readers read it (pyiceberg's scan of the current
    snapshot), by lineage, against the Kafka records of the committed
    windows' frozen ranges: each well-formed record once with its order's id
    and amount, each malformed one a dead letter of the ledger, once; nothing
    else of the pipeline's source topic; each window in one snapshot of ours
    per committed epoch."""
    from harness.iceberg import rows as table_rows

    problems: list[str] = []
    expected, malformed = _committed_records(p, conn, windows, _committed_epochs(p, conn),
                                             lambda window, order: (int(order["n"]), Decimal(order["amount"])))
    rows = [r for r in table_rows(p.url, p.table) if r["eos_topic"] in p.topics]
    problems += _lineage_problems("the table read with pyiceberg", expected, rows)
    wrong = [r for r in rows if (r["eos_topic"], r["eos_partition"], r["eos_offset"]) in expected
             and (r["id"], r["amount"]) != expected[r["eos_topic"], r["eos_partition"], r["eos_offset"]]]
    if wrong:
        problems.append(f"{len(wrong)} row(s) with another id or amount than their record's: {wrong[:5]}")
    problems += _dead_letter_problems(p, conn, malformed)
    return problems


# How to read each target as its readers do, where the ledger's database is not
# where they read it (a PostgreSQL target is read by verify itself).
READERS: dict[str, Callable[[Pipeline, psycopg.Connection, Sequence[int]], list[str]]] = {
    "files": _file_reader_problems,
    "kafka": _kafka_reader_problems,
    "iceberg": _iceberg_reader_problems,
}


