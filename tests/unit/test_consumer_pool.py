"""The pool of idle Kafka consumers (core/consumer_pool.py): equal settings
share consumers, a read that raised closes its own, idle ones expire, and a
forked child neither uses nor destroys its parent's. Real librdkafka
consumers; no broker (creating one connects to nothing reachable here)."""

from __future__ import annotations

import os
import time

import pytest

from airflow_eos.core.consumer_pool import CONSUMERS, ConsumerPool
from airflow_eos.core.kafka_client import ClientErrors, consumer_config

NOWHERE = {"bootstrap.servers": "127.0.0.1:1", "socket.timeout.ms": 1000}


def closed(pooled) -> bool:
    try:
        pooled.consumer.assignment()
    except RuntimeError as exc:
        return "closed" in str(exc)
    return False


@pytest.fixture
def pool():
    pool = ConsumerPool()
    yield pool
    pool.close()


def test_reads_with_equal_settings_take_turns_on_one_consumer(pool):
    with pool.lease(consumer_config(NOWHERE), "a test read") as first:
        pass
    # consumer_config gives each call an error callback of its own: not a setting that tells consumers apart
    with pool.lease(consumer_config(NOWHERE), "a test read") as second:
        assert second is first
        with pool.lease(consumer_config(NOWHERE), "a test read") as meanwhile:
            assert meanwhile is not first  # one read per consumer at a time
    with pool.lease(consumer_config({**NOWHERE, "client.id": "other"}), "a test read") as other:
        assert other is not first and other is not meanwhile


def test_a_consumer_whose_read_raised_is_closed_not_kept(pool):
    with pytest.raises(RuntimeError), pool.lease(consumer_config(NOWHERE), "a test read") as failed:
        raise RuntimeError("the read failed")
    assert closed(failed)
    with pool.lease(consumer_config(NOWHERE), "a test read") as after:
        assert after is not failed


def test_a_consumer_idle_longer_than_the_limit_is_closed_not_reused():
    pool = ConsumerPool(idle_s=0.0)
    try:
        with pool.lease(consumer_config(NOWHERE), "a test read") as first:
            pass
        with pool.lease(consumer_config(NOWHERE), "a test read") as second:
            assert second is not first
        assert closed(first)
    finally:
        pool.close()


def test_a_process_that_reads_no_more_closes_its_idle_consumers_all_the_same():
    pool = ConsumerPool(idle_s=0.5)
    try:
        with pool.lease(consumer_config(NOWHERE), "the last read") as last:
            pass
        deadline = time.monotonic() + 10
        while (pool._reaper is not None or not closed(last)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert closed(last)  # by the pool's thread: nothing was leased or returned since
        assert pool._reaper is None  # and the thread ended with the last idle consumer
    finally:
        pool.close()


def test_idle_consumers_per_settings_are_bounded_the_oldest_closed():
    pool = ConsumerPool(max_idle=2)
    try:
        config = consumer_config(NOWHERE)
        with pool.lease(config, "a") as a, pool.lease(config, "b") as b, pool.lease(config, "c") as c:
            pass  # returned c, b, a: c was the oldest idle when a came back
        assert closed(c)
        with pool.lease(config, "d") as d, pool.lease(config, "e") as e:
            assert {d, e} == {a, b}
    finally:
        pool.close()


def test_each_consumer_reports_its_own_errors_and_a_lease_starts_with_none(pool):
    with pool.lease(consumer_config(NOWHERE), "a test read") as pooled:
        assert isinstance(pooled.errors, ClientErrors)
        pooled.consumer.poll(1.5)  # serves its error callback: the broker refuses
        assert "127.0.0.1:1" in pooled.errors.hint("127.0.0.1:1") and pooled.errors.last
    with pool.lease(consumer_config(NOWHERE), "a test read") as again:
        assert again is pooled and again.errors.last is None  # an earlier read's error says nothing of this one


def test_a_forked_child_neither_uses_nor_destroys_its_parents_consumers():
    pool = CONSUMERS  # the process's pool: its forget-after-fork hook is registered on import
    config = consumer_config({**NOWHERE, "client.id": "fork-test"})
    with pool.lease(config, "the parent's read") as parent:
        pass
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            with pool.lease(config, "the child's read") as own:
                os.write(write, b"own" if own is not parent else b"parent's")
            pool.close()
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    said = os.read(read, 64)
    os.close(read)
    assert os.waitpid(child, 0)[1] == 0 and said == b"own"
    with pool.lease(config, "the parent's next read") as again:
        assert again is parent
        assert again.consumer.assignment() == []  # alive: the child did not close it
