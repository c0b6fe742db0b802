"""The broker unreachable at the stage and at a Kafka-target commit (issue 34,
"Broker unreachable at each step"): the test's own Apache Kafka is stopped
after the plan, before the step. The step fails with an error that names the
bootstrap address and says what to check, with nothing published; with the
broker back, the window's retry commits once and verify is clean.

Each test runs a broker of its own (the session's is shared), as
tests/chaos/test_external_faults.py does for restarts.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from airflow_eos.core.windows import WindowPlan
from airflow_eos.embedded import KafkaBroker
from harness import chaos
from harness.chaos import Harness, check, plan_step, stage_attempt
from harness.chaos.cases import PARTITIONS

# A client that cannot reach its broker gives up within seconds here, not the default minutes.
UNREACHABLE_TIMEOUTS = {"socket.timeout.ms": 3000, "fetch.wait.max.ms": 10}


def says_the_broker_is_unreachable(exc: BaseException, bootstrap: str) -> None:
    """Where (the bootstrap address), what to do (the brokers up and reachable)."""
    message = str(exc)
    assert bootstrap in message, message
    assert "that the brokers are up and reachable from this host" in message, message


def own_pipeline(make_pipeline, broker: KafkaBroker, name: str, **kwargs) -> chaos.Pipeline:
    topic = f"unreachable-{uuid.uuid4().hex[:6]}"
    chaos.create_topic(broker.bootstrap, topic, 2)
    chaos.produce(broker.bootstrap, topic, chaos.source_records(3, 12, 2))
    return dataclasses.replace(make_pipeline(name, **kwargs), topics=(topic,),
                               kafka_config={"bootstrap.servers": broker.bootstrap, **UNREACHABLE_TIMEOUTS})


def test_broker_unreachable_at_the_stage_fails_clearly_then_the_retry_commits_once(make_pipeline, tmp_path, tally):
    """Window 0 is planned; the broker stops; the stage step fails naming the
    broker, its attempt aborted, nothing published; the broker starts again
    (its log kept) and the window's next run commits it once; verify clean."""
    with KafkaBroker() as broker:
        p = own_pipeline(make_pipeline, broker, "unreachable_stage")
        h = Harness(p, tmp_path)
        plan = plan_step(p, p.window(0))
        broker.stop()
        try:
            with pytest.raises(Exception) as failed:  # noqa: PT011 - any error, as long as it says where and what
                chaos.stage_step(p, plan)
        finally:
            broker.start()
        h.note(f"stage without a broker: {type(failed.value).__name__}: {failed.value}")
        says_the_broker_is_unreachable(failed.value, broker.bootstrap)
        assert [state for _, state in chaos.attempt_states(p, 0)] == ["aborted"]
        assert not chaos.published_lineage(p), "published without a broker"
        assert h.run_until_committed([0, 1]) == 1
        tally.add(check(h, (0, 1)))


def test_broker_unreachable_at_a_kafka_target_commit_fails_clearly_then_the_retry_commits_once(
        make_pipeline, tmp_path, tally):
    """Window 0 of a Kafka-target pipeline is staged and prepared; the broker
    (source and target topic) stops; the commit fails naming the broker, and
    nothing is published (no record in the target topic, the window still
    planned); the broker starts again and the commit's retry publishes the
    window once; verify clean."""
    with KafkaBroker() as broker:
        p = own_pipeline(make_pipeline, broker, "unreachable_commit", target="kafka")
        chaos.create_topic(broker.bootstrap, p.target_topic, PARTITIONS)
        h = Harness(p, tmp_path)
        plan = WindowPlan.from_dict(plan_step(p, p.window(0)))
        attempt = p.target.begin(plan.window)
        stage_attempt(p, plan, attempt)
        assert p.target.prepare(attempt).prepared
        broker.stop()
        try:
            with pytest.raises(Exception) as failed:  # noqa: PT011 - any error, as long as it says where and what
                chaos.commit_step(p, attempt.to_dict())
        finally:
            broker.start()
        h.note(f"commit without a broker: {type(failed.value).__name__}: {failed.value}")
        says_the_broker_is_unreachable(failed.value, broker.bootstrap)
        assert "committed" not in [state for _, state in chaos.attempt_states(p, 0)]
        assert not chaos.published_lineage(p), "published without a broker"
        assert chaos.commit_step(p, attempt.to_dict())["outcome"] == "published"
        h.emitted(0, "published")
        assert h.run_until_committed([1]) == 1
        tally.add(check(h, (0, 1)))
