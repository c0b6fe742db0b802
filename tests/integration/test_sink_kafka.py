"""The Kafka target's two-phase-commit sink against a real PostgreSQL ledger and
Apache Kafka, without Spark:
a window's life (begin, write, checkpoint, prepare, commit, abort), the crash
points of the commit, a zombie committer, a Clear of a committed window, and
the bad inputs the issue names. What the topic holds is read back by lineage
through the sink's ``published_relation`` (what verify reads), which counts
only the records of committed transactions; the tests at the end read the
topic as a read_committed consumer does."""

from __future__ import annotations

import pickle
import threading
import time
from collections import Counter

import psycopg
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTP

from airflow_eos.core.attempt import ConsumedRange
from airflow_eos.core.errors import ConfigurationError, TargetError
from airflow_eos.core.sink import ALREADY_COMMITTED, PUBLISHED, SKIPPED
from airflow_eos.core.target import target_from_dict
from airflow_eos.core.windows import TopicPartition
from airflow_eos.targets.kafka import KafkaTarget
from airflow_eos.targets.kafka import client as kclient
from airflow_eos.targets.kafka.staging import KafkaStagingWriter

PIPELINE = "orders_to_topic"


def execute(url, statement, params=None):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


@pytest.fixture
def source(topics):
    return topics.create(partitions=2, prefix="src")


@pytest.fixture
def target_topic(topics):
    return topics.create(partitions=3, prefix="out")


def kafka_target(topic, pg_url, kafka_config, **kw):
    return KafkaTarget(topic=topic, key_column="key", value_column="value", header_columns=("region",),
                       ledger_url=pg_url, kafka_config=kafka_config, **kw)


@pytest.fixture
def sink(target_topic, pg_url, kafka_config, ledger):
    return kafka_target(target_topic, pg_url, kafka_config).sink()


@pytest.fixture
def plans(freeze_windows, source):
    def freeze(indices=(0,)):
        return freeze_windows(PIPELINE, list(indices), partitions=((source, 0), (source, 1)))
    return freeze


def records(plan, version=1, big=None):
    batches = []
    for r in plan.ranges:
        offsets = list(range(r.start_offset, r.end_offset))
        values = [(f"v{version} {r.topic}/{r.partition}/{o}" if (r.partition, o) != big else "x" * 2_000_000)
                  for o in offsets]
        batches.append(pa.record_batch({
            "key": pa.array([f"k{o}" for o in offsets]),
            "value": pa.array(values),
            "region": pa.array(["eu" if o % 2 else None for o in offsets]),
            "eos_topic": pa.array([r.topic] * len(offsets)),
            "eos_partition": pa.array([r.partition] * len(offsets), pa.int32()),
            "eos_offset": pa.array(offsets, pa.int64()),
        }))
    return batches


def lineage(plan):
    return sorted((r.topic, r.partition, o) for r in plan.ranges for o in range(r.start_offset, r.end_offset))


def consumed(plan):
    return [ConsumedRange(r.topic, r.partition, r.start_offset, r.end_offset, r.width) for r in plan.ranges]


def stage(sink, plan, *, version=1, big=None, prepare=True):
    attempt = sink.begin(plan.window)
    writer = pickle.loads(pickle.dumps(sink.writer(attempt)))  # as Spark ships it to a task
    chunks = [writer.write([batch]) for batch in records(plan, version, big)]
    sink.checkpoint(attempt, consumed(plan), chunks)
    if prepare:
        assert sink.prepare(attempt).prepared
    return attempt


def published(sink, pg_url, pipeline=PIPELINE):
    """What verify reads: the committed records of the pipeline, by lineage."""
    with psycopg.connect(pg_url) as conn, conn.transaction():
        relation = sink.published_relation(conn, pipeline)
        rows = conn.execute(f"SELECT eos_window_start, eos_topic, eos_partition, eos_offset, eos_epoch FROM "
                            f"{relation.as_string(conn)}").fetchall()
    return rows


def seen_lineage(sink, pg_url):
    return sorted((t, p, o) for _, t, p, o, _ in published(sink, pg_url))


def raw_records(sink):
    """Every record of the pipeline a read_committed reader of the topic sees."""
    return sink.published_records(PIPELINE)


def window_row(url, window):
    return execute(url, "SELECT state, epoch, committed_epoch, published_rows FROM eos.windows"
                        " WHERE pipeline = %s AND window_start = %s", (window.pipeline, window.start))[0]


def attempt_state(url, attempt):
    return execute(url, "SELECT state FROM eos.attempts WHERE pipeline = %s AND window_start = %s AND epoch = %s",
                   (attempt.pipeline, attempt.window_start, attempt.epoch))[0][0]


def staging_exists(url, attempt):
    return execute(url, "SELECT to_regclass(%s) IS NOT NULL", (f"eos_staging.{attempt.staging}",))[0][0]


# --------------------------------------------------------------------------- the spec


def test_spec_round_trips_refuses_replace_and_inline_secrets(target_topic):
    spec = KafkaTarget(topic="orders_curated", header_columns=["region"])
    assert target_from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["kind"] == "kafka"
    assert [r.role for r in spec.connections()] == ["ledger", "kafka"]
    bound = spec.bind({"ledger": "postgresql://x/y", "kafka": {"bootstrap.servers": "h:1"}})
    assert bound.bound and bound.target_id == "kafka:kafka_default/orders_curated"
    with pytest.raises(ConfigurationError, match="append-only"):
        KafkaTarget(topic="t", on_committed="replace")
    with pytest.raises(ConfigurationError, match="lineage"):
        KafkaTarget(topic="t", header_columns=("eos_offset",))
    with pytest.raises(ConfigurationError, match="transactional.id"):
        KafkaTarget(topic="t", producer_config={"transactional.id": "mine"})
    with pytest.raises(ConfigurationError, match="secrets"):
        bound.check_for_dag()
    with pytest.raises(ConfigurationError, match="not bound"):
        spec.sink()


def test_transactional_id_is_per_window_and_stable(plans, sink):
    p0, p1 = plans([0, 1])
    a, b = sink.transactional_id(p0.window), sink.transactional_id(p1.window)
    assert a != b and a == sink.transactional_id(p0.window) and a.startswith(f"airflow-eos.{PIPELINE}.")
    assert sink.marker_group(p0.window) == a + ".marker"
    token = kclient.new_token(7)
    assert kclient.token_epoch(token) == 7 and token > 0


# --------------------------------------------------------------------------- the happy path


def test_window_life_publishes_each_record_once_with_lineage_headers(pg_url, sink, plans, source):
    [plan] = plans([0])
    attempt = sink.begin(plan.window)
    writer = KafkaStagingWriter.from_json(sink.writer(attempt).to_json())
    chunks = [writer.write([batch]) for batch in records(plan)]
    sink.checkpoint(attempt, consumed(plan), chunks)
    assert sink.prepare(attempt).prepared
    assert raw_records(sink) == []  # nothing in the topic before the commit

    result = sink.commit(attempt)
    assert result.outcome == PUBLISHED and result.published_rows == 10 and result.committed_epoch == 1
    assert result.offsets == {TopicPartition(source, 0): 5, TopicPartition(source, 1): 5}
    assert window_row(pg_url, plan.window) == ("committed", 1, 1, 10)
    assert not staging_exists(pg_url, attempt)
    assert seen_lineage(sink, pg_url) == lineage(plan)

    recs = raw_records(sink)
    assert len(recs) == 10
    one = next(r for r in recs if r["headers"]["eos-offset"] == "1" and r["headers"]["eos-partition"] == "0")
    assert one["key"] == b"k1" and one["value"] == f"v1 {source}/0/1".encode()
    h = one["headers"]
    assert (h["eos-pipeline"], h["eos-topic"], h["eos-epoch"]) == (PIPELINE, source, "1")
    assert h["eos-window-start"] == plan.window.start.isoformat()
    [(token,)] = execute(pg_url, "SELECT token FROM eos.kafka_commits WHERE pipeline = %s", (PIPELINE,))
    assert h["eos-commit"] == str(token)
    marker = kclient.read_marker(sink.kafka_config, sink.marker_group(attempt), sink.topic, result.offsets)
    assert marker.token == token and marker.epoch == 1 and dict(marker.offsets) == result.offsets

    again = sink.commit(attempt)  # a retried commit task
    assert again.outcome == ALREADY_COMMITTED and again.published_rows == 10
    assert len(raw_records(sink)) == 10


def test_headers_from_columns_and_null_header_left_out(pg_url, sink, plans):
    [plan] = plans([0])
    sink.commit(stage(sink, plan))
    recs = raw_records(sink)
    odd = [r for r in recs if int(r["headers"]["eos-offset"]) % 2]
    even = [r for r in recs if not int(r["headers"]["eos-offset"]) % 2]
    assert len(odd) == 4 and all(r["headers"]["region"] == b"eu" for r in odd)
    assert len(even) == 6 and all("region" not in r["headers"] for r in even)


def test_windows_commit_in_any_order_and_offsets_follow_the_prefix(pg_url, sink, plans, source):
    p0, p1 = plans([0, 1])
    a1 = stage(sink, p1)
    assert sink.commit(a1).offsets == {}  # window 0 not committed: no prefix yet
    a0 = stage(sink, p0)
    assert sink.commit(a0).offsets == {TopicPartition(source, 0): 10, TopicPartition(source, 1): 10}
    assert seen_lineage(sink, pg_url) == sorted(lineage(p0) + lineage(p1))


# --------------------------------------------------------------------------- crashes inside the commit


def test_crash_before_producing_then_retry_publishes_once(pg_url, sink, plans, monkeypatch):
    [plan] = plans([0])
    attempt = stage(sink, plan)
    monkeypatch.setenv("EOS_FAULTS", "commit.before_publish=raise")
    with pytest.raises(Exception, match="commit.before_publish"):
        sink.commit(attempt)
    monkeypatch.delenv("EOS_FAULTS")
    assert window_row(pg_url, plan.window)[0] == "planned"
    assert sink.commit(attempt).outcome == PUBLISHED
    assert seen_lineage(sink, pg_url) == lineage(plan)


def test_crash_mid_produce_then_retry_publishes_once(pg_url, sink, plans, monkeypatch):
    [plan] = plans([0])
    attempt = stage(sink, plan)
    monkeypatch.setenv("EOS_FAULTS", "commit.mid_produce=raise")
    with pytest.raises(Exception, match="commit.mid_produce"):
        sink.commit(attempt)
    monkeypatch.delenv("EOS_FAULTS")
    assert window_row(pg_url, plan.window)[0] == "planned"
    assert sink.commit(attempt).outcome == PUBLISHED
    assert seen_lineage(sink, pg_url) == lineage(plan)  # exactly once, by the committed token
    epochs = Counter(e for *_, e in published(sink, pg_url))
    assert epochs == {1: 10}


def test_crash_after_kafka_commit_before_ledger_retry_records_it(pg_url, sink, plans, monkeypatch):
    [plan] = plans([0])
    attempt = stage(sink, plan)
    monkeypatch.setenv("EOS_FAULTS", "commit.after_kafka_commit=raise")
    with pytest.raises(Exception, match="commit.after_kafka_commit"):
        sink.commit(attempt)
    monkeypatch.delenv("EOS_FAULTS")
    assert window_row(pg_url, plan.window)[0] == "planned"  # the ledger was not told
    assert len(raw_records(sink)) == 10  # but Kafka holds the window
    result = sink.commit(attempt)  # the retry: the marker says it committed
    assert result.outcome == ALREADY_COMMITTED and result.published_rows == 10
    assert window_row(pg_url, plan.window) == ("committed", 1, 1, 10)
    assert len(raw_records(sink)) == 10
    assert seen_lineage(sink, pg_url) == lineage(plan)


def test_crash_after_kafka_commit_then_rerun_skips_and_records_the_first(pg_url, sink, plans, monkeypatch):
    """A Clear after the crash: the rerun's attempt fences the first in the
    ledger, but the first one's transaction committed: it is recorded, the
    rerun skipped, nothing published twice."""
    [plan] = plans([0])
    first = stage(sink, plan)
    monkeypatch.setenv("EOS_FAULTS", "commit.after_kafka_commit=raise")
    with pytest.raises(Exception):
        sink.commit(first)
    monkeypatch.delenv("EOS_FAULTS")
    second = stage(sink, plan, version=2)
    result = sink.commit(second)
    assert result.outcome == SKIPPED and result.committed_epoch == 1
    assert attempt_state(pg_url, first) == "committed" and attempt_state(pg_url, second) == "aborted"
    assert not staging_exists(pg_url, second)
    assert seen_lineage(sink, pg_url) == lineage(plan)
    assert {e for *_, e in published(sink, pg_url)} == {1}


def test_teardown_after_kafka_commit_records_instead_of_aborting(pg_url, sink, plans, monkeypatch):
    [plan] = plans([0])
    attempt = stage(sink, plan)
    monkeypatch.setenv("EOS_FAULTS", "commit.after_kafka_commit=raise")
    with pytest.raises(Exception):
        sink.commit(attempt)
    monkeypatch.delenv("EOS_FAULTS")
    assert sink.abort_window(plan.window, "the commit task failed") == []
    assert window_row(pg_url, plan.window) == ("committed", 1, 1, 10)
    assert seen_lineage(sink, pg_url) == lineage(plan)


# --------------------------------------------------------------------------- zombies, races, clears


def test_zombie_committer_is_fenced_and_its_open_transaction_aborted(pg_url, sink, plans, kafka_config):
    """A committer of the window that died (or hangs) with its transaction
    open: the next commit's init_transactions fences it and aborts the
    transaction; the zombie's commit then fails; its records never count."""
    [plan] = plans([0])
    attempt = stage(sink, plan)
    zombie = Producer({**kafka_config, "transactional.id": sink.transactional_id(attempt)})
    zombie.init_transactions(10)
    zombie.begin_transaction()
    zombie.produce(sink.topic, value=b"zombie", headers=[("eos-pipeline", PIPELINE.encode()),
                                                          ("eos-window-start", plan.window.start.isoformat().encode()),
                                                          ("eos-commit", b"1")])
    zombie.flush(10)
    assert sink.commit(attempt).outcome == PUBLISHED
    with pytest.raises(Exception):
        zombie.commit_transaction(5)
    assert seen_lineage(sink, pg_url) == lineage(plan)


def test_two_commits_of_one_window_at_once_publish_once(pg_url, sink, plans):
    [plan] = plans([0])
    attempt = stage(sink, plan)
    outcomes, errors = [], []

    def run():
        try:
            outcomes.append(sink.commit(attempt).outcome)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and sorted(outcomes) == sorted([PUBLISHED, ALREADY_COMMITTED])
    assert len(raw_records(sink)) == 10
    assert seen_lineage(sink, pg_url) == lineage(plan)


def test_clear_of_a_committed_window_is_skipped(pg_url, sink, plans):
    [plan] = plans([0])
    assert sink.commit(stage(sink, plan)).outcome == PUBLISHED
    rerun = stage(sink, plan, version=2)
    result = sink.commit(rerun)
    assert result.outcome == SKIPPED and result.committed_epoch == 1
    assert attempt_state(pg_url, rerun) == "aborted" and not staging_exists(pg_url, rerun)
    assert len(raw_records(sink)) == 10


def test_abort_drops_staging_and_publishes_nothing(pg_url, sink, plans):
    [plan] = plans([0])
    attempt = stage(sink, plan)
    assert [a.epoch for a in sink.abort_window(plan.window, "stage failed")] == [1]
    assert attempt_state(pg_url, attempt) == "aborted" and not staging_exists(pg_url, attempt)
    assert raw_records(sink) == []
    assert sink.abort(attempt, "again") is False


# --------------------------------------------------------------------------- bad inputs


def test_missing_topic_is_a_clear_error_and_never_created(pg_url, kafka_config, ledger, plans, topics):
    sink = kafka_target("no-such-topic-" + str(time.time_ns()), pg_url, kafka_config).sink()
    [plan] = plans([0])
    with pytest.raises(TargetError, match="does not exist.*never creates"):
        sink.begin(plan.window)
    assert execute(pg_url, "SELECT count(*) FROM eos.attempts")[0][0] == 0
    assert sink.topic not in topics.admin.list_topics(timeout=10).topics  # not created by the check


def test_record_too_large_names_its_source_and_publishes_nothing(pg_url, target_topic, kafka_config, ledger,
                                                                 plans, source):
    sink = kafka_target(target_topic, pg_url, kafka_config, producer_config={"message.max.bytes": 1_000_000}).sink()
    [plan] = plans([0])
    attempt = stage(sink, plan, big=(1, 3))
    with pytest.raises(TargetError, match=rf"{source}\[1\]@3 is too large"):
        sink.commit(attempt)
    assert window_row(pg_url, plan.window)[0] == "planned"
    assert seen_lineage(sink, pg_url) == []


def test_staging_changed_after_checkpoint_is_not_committed(pg_url, sink, plans):
    from airflow_eos.core.errors import NotPrepared
    [plan] = plans([0])
    attempt = stage(sink, plan)
    execute(pg_url, f'DELETE FROM eos_staging."{attempt.staging}" WHERE eos_offset = 2')
    with pytest.raises(NotPrepared):
        sink.commit(attempt)
    assert raw_records(sink) == []


# --------------------------------------------------------------------------- a correct broker


def test_read_committed_consumer_sees_each_source_record_once_after_aborts(pg_url, sink, plans, kafka_config,
                                                                          monkeypatch):
    [plan] = plans([0])
    attempt = stage(sink, plan)
    monkeypatch.setenv("EOS_FAULTS", "commit.mid_produce=raise")
    with pytest.raises(Exception):
        sink.commit(attempt)
    monkeypatch.delenv("EOS_FAULTS")
    sink.commit(attempt)
    consumer = Consumer({**kafka_config, "group.id": "rc", "isolation.level": "read_committed",
                         "enable.partition.eof": True, "enable.auto.commit": False})
    consumer.assign([KafkaTP(sink.topic, p, 0) for p in range(3)])
    seen, eof = [], set()
    while len(eof) < 3:
        m = consumer.poll(1)
        if m is None:
            continue
        if m.error():
            assert m.error().code() == KafkaError._PARTITION_EOF
            eof.add(m.partition())
            continue
        h = dict(m.headers())
        seen.append((h["eos-topic"].decode(), int(h["eos-partition"]), int(h["eos-offset"])))
    consumer.close()
    assert sorted(seen) == lineage(plan)


def test_teardown_ends_a_transaction_a_dead_committer_left_open(pg_url, sink, plans, kafka_config):
    """A committer killed with its transaction open, and no retry: the
    embedded broker never times the transaction out (read_committed readers
    of the partition would stall). The window's teardown fences the
    window's transactional.id, which aborts it; the window can run again."""
    [plan] = plans([0])
    attempt = stage(sink, plan)
    dead = Producer({**kafka_config, "transactional.id": sink.transactional_id(attempt)})
    dead.init_transactions(10)
    dead.begin_transaction()
    for p in range(3):
        dead.produce(sink.topic, value=b"left open", partition=p,
                     headers=[("eos-pipeline", PIPELINE.encode()),
                              ("eos-window-start", plan.window.start.isoformat().encode()), ("eos-commit", b"1")])
    dead.flush(10)
    del dead  # never committed nor aborted
    assert [a.epoch for a in sink.abort_window(plan.window, "commit task killed")] == [1]
    rerun = stage(sink, plan, version=2)
    assert sink.commit(rerun).outcome == PUBLISHED
    assert seen_lineage(sink, pg_url) == lineage(plan)
    assert {e for *_, e in published(sink, pg_url)} == {2}


# --------------------------------------------------------------------------- verify reads the whole topic (issue 33)

def _source_records(topics, source):
    """The records the frozen window 0 plans (offsets 0..4 of both partitions), stamped inside it."""
    from datetime import datetime, timezone
    from airflow_eos.core.windows import to_millis
    t0 = to_millis(datetime(2024, 1, 1, tzinfo=timezone.utc))
    topics.produce(source, [(p, t0 + 60_000 * o, f"src {p}/{o}".encode()) for p in (0, 1) for o in range(5)])


def test_verify_reports_a_second_pipeline_publishing_the_same_records_through_another_connection_id(
        pg_url, sink, freeze_windows, source, topics, target_topic, kafka_config, ledger):
    """The issue's case: pipeline 'copy' reads the same source topic and
    publishes into the same topic, naming the cluster by another connection id.
    A read_committed reader of the topic sees every source record twice; each
    pipeline's verify says so, naming the other pipeline from the lineage headers."""
    from airflow_eos.verify import FOREIGN, verify

    _source_records(topics, source)
    partitions = ((source, 0), (source, 1))
    [plan] = freeze_windows(PIPELINE, [0], partitions=partitions)
    [copy_plan] = freeze_windows("copy", [0], partitions=partitions)
    copy_sink = kafka_target(target_topic, pg_url, kafka_config, kafka_conn_id="kafka_other").sink()
    assert sink.commit(stage(sink, plan)).outcome == PUBLISHED
    assert copy_sink.commit(stage(copy_sink, copy_plan)).outcome == PUBLISHED

    for name, own, other in ((PIPELINE, sink, "copy"), ("copy", copy_sink, PIPELINE)):
        report = verify(ledger, kafka_config, own, name)
        foreign = [x for x in report.violations if x.kind == FOREIGN]
        assert not report.clean
        assert sorted((x.topic, x.partition, x.offset) for x in foreign) == lineage(plan)  # each record, by lineage
        assert all(f"pipeline {other!r}" in x.message and target_topic in x.message for x in foreign)


def test_verify_reports_a_foreign_writers_record_and_accepts_disjoint_pipelines(
        pg_url, sink, freeze_windows, source, topics, target_topic, kafka_config, ledger):
    """A record no airflow-eos pipeline wrote (no lineage headers) is seen by the
    topic's readers: a violation. Records of another pipeline with other source
    topics are that pipeline's: not a violation of this one."""
    from airflow_eos.verify import FOREIGN, verify

    _source_records(topics, source)
    other_source = topics.create(partitions=1, prefix="src")
    [plan] = freeze_windows(PIPELINE, [0], partitions=((source, 0), (source, 1)))
    [other_plan] = freeze_windows("disjoint", [0], partitions=((other_source, 0),))
    assert sink.commit(stage(sink, plan)).outcome == PUBLISHED
    other_sink = kafka_target(target_topic, pg_url, kafka_config).sink()
    assert other_sink.commit(stage(other_sink, other_plan)).outcome == PUBLISHED
    assert verify(ledger, kafka_config, sink, PIPELINE).clean

    topics.produce(target_topic, [(2, 0, b"written by hand")])
    report = verify(ledger, kafka_config, sink, PIPELINE)
    [foreign] = [x for x in report.violations if x.kind == FOREIGN]
    assert not report.clean and "no airflow-eos lineage headers" in foreign.message
    assert f"topic {target_topic} partition 2" in foreign.message
    assert seen_lineage(sink, pg_url) == lineage(plan)  # the pipeline's own records are still each there once


def test_reading_the_whole_topic_starts_where_retention_left_each_log(sink, target_topic, topics):
    """verify reads the target topic from each partition's log start: after
    retention (here delete_records) moved it past offset 0, the records still
    there are read, not skipped by a jump to the partition's end."""
    topics.produce(target_topic, [(p, 0, f"{p}-{i}".encode()) for p in range(3) for i in range(5)])
    for f in topics.admin.delete_records([KafkaTP(target_topic, 0, 3)]).values():
        f.result(15)
    read = sink.read_topic(lambda headers: True)
    assert sorted((r["partition"], r["offset"]) for r in read) == (
        [(0, 3), (0, 4)] + [(p, i) for p in (1, 2) for i in range(5)])
