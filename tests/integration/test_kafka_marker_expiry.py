"""The Kafka target's commit marker when Apache Kafka has expired it (issue 34):
a commit that died after its Kafka transaction committed is finished from its
commit intent (airflow_eos/targets/kafka/intent.py) and never publishes twice;
when the topic can no longer tell either, the commit refuses, says what to do,
and after `airflow-eos resolve` the window ends committed once.

What the commit sees of an expired marker is its group without offsets: when
``offsets.retention.minutes`` (7 days by default) has passed, the broker drops
the offsets of the group, which has no member, and the group with them. The
tests reproduce that at once by deleting the marker group (``deleted``); the
first test also runs on a broker of its own whose retention is one minute,
checked every second, and waits for the broker to expire the marker
(``expired``, marked slow: ``make test`` runs it, ``make test-fast`` does not).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest
import test_sink_kafka as kafka
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient
from harness.topics import TopicFactory

from airflow_eos.cli import main
from airflow_eos.core.errors import CommitOutcomeUnknown
from airflow_eos.core.sink import ALREADY_COMMITTED, PUBLISHED
from airflow_eos.embedded import KafkaBroker
from airflow_eos.targets.kafka import client as kclient

PIPELINE = kafka.PIPELINE
EXPIRY_DEADLINE_S = 150  # retention 60 s + the check every second, on a loaded machine
# How a test's marker goes: deleted by the test, or expired by the broker's retention (a minute's wait).
MARKER_LOSSES = ("deleted", pytest.param("expired", marks=pytest.mark.slow))


@pytest.fixture(scope="module")
def expiring_kafka(pg_server):
    broker = KafkaBroker(settings={"offsets.retention.minutes": "1",
                                   "offsets.retention.check.interval.ms": "1000"}).start()
    yield broker
    broker.destroy()


@pytest.fixture
def marker_loss():
    """How the marker goes where a test does not say: deleted (the run's broker)."""
    return "deleted"


@pytest.fixture
def window(marker_loss, request, pg_url, ledger, freeze_windows):
    """Window 0 of a source topic with its records, planned; a target topic; the
    sink; on the broker whose retention expires the marker, for ``expired``."""
    bootstrap = (request.getfixturevalue("expiring_kafka").bootstrap if marker_loss == "expired"
                 else request.getfixturevalue("kafka").address)
    config = {"bootstrap.servers": bootstrap}
    topics = TopicFactory(bootstrap)
    source, target = topics.create(partitions=2, prefix="src"), topics.create(partitions=3, prefix="out")
    kafka._source_records(topics, source)
    [plan] = freeze_windows(PIPELINE, [0], partitions=((source, 0), (source, 1)))
    sink = kafka.kafka_target(target, pg_url, config).sink()
    yield plan, sink, config
    topics.close()


def crash_after_kafka_commit(sink, plan, monkeypatch):
    attempt = kafka.stage(sink, plan)
    monkeypatch.setenv("EOS_FAULTS", "commit.after_kafka_commit=raise")
    with pytest.raises(Exception, match="commit.after_kafka_commit"):
        sink.commit(attempt)
    monkeypatch.delenv("EOS_FAULTS")
    assert kafka.window_row(sink.ledger_url, plan.window)[0] == "planned"  # the ledger was not told
    return attempt


def lose_marker(sink, plan, how):
    """The window's marker group's offsets gone, ``how``: ``expired`` waits
    until the broker's retention has dropped them (polled; a deadline);
    ``deleted`` deletes the group (it has no member). Either way the group is
    then gone from the broker, offsets and all: the expiry removes a group
    without members along with its last offsets, so the deletion leaves what
    it leaves."""
    ends = {r.tp: r.end_offset for r in plan.ranges}
    group = sink.marker_group(plan.window)
    assert kclient.read_marker(sink.kafka_config, group, sink.topic, ends) is not None
    assert group in groups(sink.kafka_config)
    if how == "deleted":
        admin = AdminClient(sink.kafka_config)  # not outliving this call: delete_records says why
        admin.delete_consumer_groups([group], request_timeout=30)[group].result(timeout=30)
        del admin
    deadline = time.monotonic() + EXPIRY_DEADLINE_S
    while kclient.read_marker(sink.kafka_config, group, sink.topic, ends) is not None:
        assert time.monotonic() < deadline, f"the offsets of {group} did not go in {EXPIRY_DEADLINE_S}s"
        time.sleep(2)
    assert group not in groups(sink.kafka_config)


def groups(config):
    """The ids of the consumer groups the broker knows."""
    admin = AdminClient(config)
    return {g.group_id for g in admin.list_consumer_groups(request_timeout=30).result(timeout=30).valid}


def intents(pg_url):
    return kafka.execute(pg_url, "SELECT epoch, token, records, resolution, resolved_how FROM eos.kafka_intents"
                                 " ORDER BY created_at")


def lineage_in_topic(sink):
    """Every record of the pipeline a read_committed reader of the topic sees, by its source record."""
    return Counter((r["headers"]["eos-topic"], int(r["headers"]["eos-partition"]), int(r["headers"]["eos-offset"]))
                   for r in sink.published_records(PIPELINE))


def topic_ends(sink):
    """The ends of the target topic's partitions once no transaction is in
    flight on it. A committed transaction's markers are written after the
    producer's commit returns (the coordinator answers once the commit is in
    its own log), so ends read right after a commit may lack them."""
    return {p: b.end for p, b in sink._settled_bounds(wait=90).items()}


def delete_records(config, topic, ends):
    """Kafka's delete_records up to ``ends``, by an admin client that does not
    outlive this call (one held by a test's frame, which a caught exception's
    traceback keeps alive, would retry the module's broker after it stopped)."""
    admin = AdminClient(config)
    for f in admin.delete_records([KafkaTP(topic, p, o) for p, o in ends.items()]).values():
        f.result(timeout=30)


def verify_clean(ledger, config, sink):
    from airflow_eos.verify import verify
    report = verify(ledger, config, sink, PIPELINE)
    assert report.clean, [v.message for v in report.violations]


@pytest.mark.parametrize("marker_loss", MARKER_LOSSES)
def test_marker_expired_after_the_kafka_commit_the_retry_records_it_and_publishes_nothing(
        pg_url, ledger, window, marker_loss, monkeypatch):
    plan, sink, config = window
    attempt = crash_after_kafka_commit(sink, plan, monkeypatch)
    [(_, token, records, resolution, _)] = intents(pg_url)
    assert (records, resolution) == (10, None)  # the intent outlived the ledger transaction
    lose_marker(sink, plan, marker_loss)
    ends = topic_ends(sink)

    result = sink.commit(attempt)  # the retry: no marker, but the topic holds the token's records
    assert result.outcome == ALREADY_COMMITTED and result.published_rows == 10
    assert kafka.window_row(pg_url, plan.window) == ("committed", 1, 1, 10)
    assert topic_ends(sink) == ends  # nothing produced
    assert lineage_in_topic(sink) == Counter(kafka.lineage(plan))  # each source record once, none else
    [(_, settled, _, resolution, how)] = intents(pg_url)
    assert (settled, resolution) == (token, "committed") and "are in the topic" in how, how
    assert kafka.execute(pg_url, "SELECT token FROM eos.kafka_commits") == [(token,)]
    verify_clean(ledger, config, sink)


def test_marker_expired_and_records_deleted_refuses_until_a_person_answers(pg_url, ledger, window, monkeypatch):
    plan, sink, config = window
    attempt = crash_after_kafka_commit(sink, plan, monkeypatch)
    [(_, token, *_)] = intents(pg_url)
    ends = topic_ends(sink)
    delete_records(config, sink.topic, ends)
    lose_marker(sink, plan, "deleted")

    for finish in (lambda: sink.commit(attempt), lambda: sink.abort_window(plan.window, "commit failed")):
        with pytest.raises(CommitOutcomeUnknown) as refused:
            finish()
        message = str(refused.value)
        for said in (str(plan.window), "attempt 1", f"commit token {token}", sink.transactional_id(attempt),
                     sink.marker_group(attempt), "offsets.retention.minutes", "were deleted",
                     "Nothing was published", f"airflow-eos resolve --pipeline {PIPELINE}", "--committed"):
            assert said in message, (said, message)
        assert CommitOutcomeUnknown.terminal
    assert kafka.window_row(pg_url, plan.window)[0] == "planned"
    assert kafka.attempt_state(pg_url, attempt) == "prepared"
    assert topic_ends(sink) == ends and lineage_in_topic(sink) == Counter()  # nothing published again

    out = io.StringIO()
    argv = ["resolve", "--postgres-url", pg_url, "--pipeline", PIPELINE, "--window-start",
            plan.window.start.isoformat(), "--token", str(token), "--committed"]
    assert main(argv, out=out) == 0, out.getvalue()
    assert "committed" in out.getvalue()
    assert main(argv, out=io.StringIO(), err=io.StringIO()) == 2  # answered already

    result = sink.commit(attempt)
    assert result.outcome == ALREADY_COMMITTED
    assert kafka.window_row(pg_url, plan.window) == ("committed", 1, 1, 10)
    assert kafka.execute(pg_url, "SELECT token FROM eos.kafka_commits") == [(token,)]
    assert topic_ends(sink) == ends and lineage_in_topic(sink) == Counter()  # committed once: never republished


@pytest.mark.parametrize("point", ["commit.before_publish", "commit.mid_produce"])
def test_a_committer_killed_inside_its_transaction_leaves_its_intent_and_the_retry_publishes_once(
        point, pg_url, ledger, window):
    """The process dies inside its transaction (no abort, no word to the
    ledger): its intent stays unsettled. The retry fences the transaction
    (aborted), finds none of its records in the topic (before_publish: it
    produced none, the read starts at the end), settles it aborted and
    publishes the window once."""
    plan, sink, config = window
    attempt = kafka.stage(sink, plan)
    code = ("import json, sys\nfrom airflow_eos.core.attempt import Attempt\n"
            "from airflow_eos.core.target import target_from_dict\n"
            "target_from_dict(json.loads(sys.argv[1])).sink().commit(Attempt.from_dict(json.loads(sys.argv[2])))\n")
    killed = subprocess.run([sys.executable, "-c", code, json.dumps(sink.to_dict()), json.dumps(attempt.to_dict())],
                            check=False, env={**os.environ, "EOS_FAULTS": f"{point}=crash"},
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == 137, killed.stderr[-3000:]
    [(_, first, _, resolution, _)] = intents(pg_url)
    assert resolution is None

    assert sink.commit(attempt).outcome == PUBLISHED
    settled = {t: (r, how) for _, t, _, r, how in intents(pg_url)}
    assert settled[first][0] == "aborted" and "none of its records" in settled[first][1]
    assert sorted(r for r, _ in settled.values()) == ["aborted", "committed"]
    assert lineage_in_topic(sink) == Counter(kafka.lineage(plan))
    verify_clean(ledger, config, sink)


def test_an_intent_of_no_records_is_settled_aborted_without_reading_the_topic(pg_url, ledger, window):
    """A try that was to publish no record (every row filtered out) and died:
    nothing of it can be found in the topic, and publishing the window again
    duplicates nothing; it is settled aborted and the window published."""
    plan, sink, config = window
    attempt = kafka.stage(sink, plan)
    kafka.execute(pg_url, "INSERT INTO eos.kafka_intents (pipeline, window_start, target, epoch, token,"
                          " transactional_id, marker_group, topic_ends, records) VALUES (%s, %s, %s, 1, %s, %s, %s,"
                          " '{\"0\": 0}', 0)",
                  (PIPELINE, plan.window.start, sink.target_id, kclient.new_token(1), sink.transactional_id(attempt),
                   sink.marker_group(attempt)))
    assert sink.commit(attempt).outcome == PUBLISHED
    settled = [(records, r, how) for _, _, records, r, how in intents(pg_url)]
    assert settled[0][:2] == (0, "aborted") and "duplicates nothing" in settled[0][2]
    assert settled[1][:2] == (10, "committed")
    assert lineage_in_topic(sink) == Counter(kafka.lineage(plan))
    verify_clean(ledger, config, sink)
