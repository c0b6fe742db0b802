"""Idle Kafka consumers kept for the next read with the same settings.

Every read of the package (a plan's probes, a Spark task's range, verify's
pass over a window) assigns partitions by offset on a consumer that joins no
group, so a consumer is as good for the next read as a new one, once it is
unassigned. A new one costs the broker and this process a connection, an
ApiVersions, a Metadata and a FindCoordinator exchange (measured here:
~3.5 ms of the broker's CPU and ~2.3 ms of the client's, and tens of ms of
waiting), which a plan of a few partitions or a Spark task of a narrow range
pays more for than for its records. Spark's own Kafka connector keeps its
executors' consumers the same way (``KafkaDataConsumer``'s cache); here the
Python workers Spark reuses between tasks keep theirs.

A consumer goes back to the pool only from a read that ended normally: one
whose read raised (an unreachable broker, an error of the log) is closed,
so no later read starts where a failed one stopped. One left idle longer
than ``IDLE_S`` is closed by a thread of the pool's. A consumer is never
used, closed or destroyed in a process other than the one that made it:
librdkafka's threads do not survive a fork.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from airflow_eos.core.kafka_client import LIBRDKAFKA_LOG, ClientErrors, reader

# Long enough for the tasks of a stage and the windows of a backfill to find
# the consumers of the ones before them; short enough that an idle process
# holds no connections for long (a thread closes them, see ConsumerPool._reap).
IDLE_S = 60.0
# KafkaLog reads up to 16 partitions at once; more idle ones than that per
# setting are not worth their threads.
MAX_IDLE_PER_SETTINGS = 16


@dataclass(eq=False)
class PooledConsumer:
    """A consumer of the pool, with what its errors said (``errors``: its
    ``error_cb``, for the message that gives up on the cluster) and the
    topics it has metadata of (see KafkaLog._fetch_metadata)."""

    consumer: Any
    errors: ClientErrors
    topics_known: set[str] = field(default_factory=set)
    pid: int = field(default_factory=os.getpid)
    idle_since: float = 0.0


def _settings_key(config: dict) -> tuple:
    """What makes two consumers interchangeable: every setting but the
    per-client error callback. A value that cannot be hashed (a callable a
    user passed) counts by identity."""
    items = []
    for name, value in config.items():
        if isinstance(value, ClientErrors):
            continue
        try:
            hash(value)
        except TypeError:
            value = ("id", id(value))
        items.append((name, value))
    return tuple(sorted(items, key=lambda item: item[0]))


class ConsumerPool:
    """Idle consumers per settings; ``lease`` hands one out for one read."""

    def __init__(self, idle_s: float = IDLE_S, max_idle: int = MAX_IDLE_PER_SETTINGS):
        self.idle_s = idle_s
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: dict[tuple, list[PooledConsumer]] = {}
        self._reaper: threading.Thread | None = None

    @contextmanager
    def lease(self, config: dict, purpose: str) -> Iterator[PooledConsumer]:
        """A consumer for ``config`` (see kafka_client.consumer_config), idle
        or new (``reader``'s errors for a configuration librdkafka refuses),
        for the body of the ``with``; back to the pool, unassigned, when the
        body ends normally, closed when it raises."""
        key = _settings_key(config)
        pooled = self._take(key)
        if pooled is None:
            pooled = _new(config, purpose)
        pooled.errors.last = None  # an earlier read's error says nothing of this one
        try:
            yield pooled
        except BaseException:
            _close(pooled)
            raise
        self._give_back(key, pooled)

    def _take(self, key: tuple) -> PooledConsumer | None:
        with self._lock:
            expired = self._expired(time.monotonic())
            idle = self._idle.get(key)
            pooled = idle.pop() if idle else None
        for old in expired:
            _close(old)
        return pooled

    def _give_back(self, key: tuple, pooled: PooledConsumer) -> None:
        if pooled.pid != os.getpid():
            return  # leased before a fork, returned in the child: the parent's
        try:
            pooled.consumer.unassign()
        except Exception:  # noqa: BLE001 - a consumer that cannot unassign is not reused
            _close(pooled)
            return
        pooled.idle_since = time.monotonic()
        with self._lock:
            idle = self._idle.setdefault(key, [])
            surplus = idle.pop(0) if len(idle) >= self.max_idle else None
            idle.append(pooled)
            expired = self._expired(pooled.idle_since)
            if self._idle and self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="eos-kafka-consumer-reaper", daemon=True)
                self._reaper.start()
        for old in ([surplus] if surplus else []) + expired:
            _close(old)

    def _reap(self) -> None:
        """While consumers are idle, close those idle past idle_s: a process
        that reads no more (an API server after a status page, a triggerer)
        holds no connections for long."""
        while True:
            time.sleep(max(self.idle_s / 2, 1.0))
            with self._lock:
                expired = self._expired(time.monotonic())
                done = not self._idle
                if done:
                    self._reaper = None
            for old in expired:
                _close(old)
            if done:
                return

    def _expired(self, now: float) -> list[PooledConsumer]:
        """Removes and returns the consumers idle longer than idle_s (under the lock)."""
        expired: list[PooledConsumer] = []
        for key, idle in list(self._idle.items()):
            keep = []
            for pooled in idle:
                (keep if now - pooled.idle_since < self.idle_s else expired).append(pooled)
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        return expired

    def close(self) -> None:
        """Close every idle consumer (at exit; the tests between brokers)."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for pooled in (p for consumers in idle.values() for p in consumers):
            _close(pooled)

    def _forget_after_fork(self) -> None:
        """In a forked child: the idle consumers are the parent's (see _keep_for_good)."""
        self._lock, self._reaper = threading.Lock(), None
        idle, self._idle = self._idle, {}
        for pooled in (p for consumers in idle.values() for p in consumers):
            _keep_for_good(pooled)


def _new(config: dict, purpose: str) -> PooledConsumer:
    """A consumer with a ClientErrors of its own as its error callback and
    logger (unless the settings name others), so that what it reports is
    told apart from other consumers' and muted while it is closed."""
    errors = ClientErrors()
    own = {"error_cb": errors} if config.get("error_cb") is None or isinstance(config["error_cb"], ClientErrors) else {}
    if config.get("logger") is None or config["logger"] is LIBRDKAFKA_LOG:
        own["logger"] = errors
    return PooledConsumer(reader({**config, **own}, purpose), errors)


def _keep_for_good(pooled: PooledConsumer) -> None:
    """A consumer of a parent process, in a forked child: dropping the last
    reference would destroy it, which waits for librdkafka threads the
    child does not have and closes sockets the parent uses. Kept alive for
    good (a list, as core/database.py keeps its sessions, would be freed at
    the child's exit and destroy them then)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(pooled.consumer))


def _close(pooled: PooledConsumer) -> None:
    if pooled.pid != os.getpid():
        _keep_for_good(pooled)
        return
    pooled.errors.muted = True
    try:
        pooled.consumer.close()
    except Exception:  # noqa: BLE001 - closing a consumer whose broker is gone may complain; it is closed
        pass


def of_another_partition(msg, topic: str, partition: int) -> bool:
    """A message of another partition than the one a read assigned: a
    pooled consumer's earlier assignment's (librdkafka drops those itself;
    they would come first, before any of this assignment's). A client-wide
    error names no partition: not another's."""
    return msg.topic() is not None and (msg.topic() != topic or msg.partition() != partition)


CONSUMERS = ConsumerPool()
atexit.register(CONSUMERS.close)
os.register_at_fork(after_in_child=CONSUMERS._forget_after_fork)

__all__ = ["CONSUMERS", "IDLE_S", "ConsumerPool", "PooledConsumer", "of_another_partition"]
