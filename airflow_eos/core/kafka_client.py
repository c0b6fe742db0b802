"""The package's librdkafka clients: their settings (the reader's defaults and
the settings the protocol depends on), their log through Python logging
(throttled), their errors, and creating a consumer with an error that says
what to change."""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator

from airflow_eos.core.client_settings import without_secrets
from airflow_eos.core.errors import ConfigurationError, SourceUnavailable

# Settings that make single-record probes fast and reads exact. Users' settings
# (security, client ids, ...) are merged over the defaults but never over the
# safety ones, which the protocol depends on.
_DEFAULTS = {
    "fetch.wait.max.ms": 10,
    # librdkafka's default (1 s) idles a reader after it drains its prefetch
    # queue: measured ~200k -> ~850k records/s for one consumer with 10 ms.
    "fetch.queue.backoff.ms": 10,
    "socket.timeout.ms": 10_000,
}
_FORCED = {
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "error",  # a seek outside the log must fail loudly, not jump
    "allow.auto.create.topics": False,
    "isolation.level": "read_committed",
}


# Throughput settings for bulk reads (the stage's reader, verify); a user's
# settings override them, the safety settings of consumer_config override both.
READER_KAFKA_DEFAULTS = {
    # When its prefetch queue is full, librdkafka pauses fetching for
    # fetch.queue.backoff.ms (default 1000): a reader that drains the queue in
    # 0.1 s then idles. Measured on Tansu, a Kafka-protocol broker: ~200k -> ~850k records/s
    # per consumer.
    "fetch.queue.backoff.ms": 10,
    "fetch.wait.max.ms": 10,
    "max.partition.fetch.bytes": 8 * 1024 * 1024,
    "fetch.max.bytes": 64 * 1024 * 1024,
    "receive.message.max.bytes": 65 * 1024 * 1024,
}


def request_timeout(config, longest: float) -> float:
    """How long a request of the package's own (metadata, a probe read) waits
    for the cluster: ``longest``, or the connection's ``socket.timeout.ms``
    (librdkafka's timeout of a network request) when it sets a shorter one,
    so that an unreachable cluster fails a step as soon as the user's
    settings say it should."""
    socket_ms = config.get("socket.timeout.ms")
    return min(longest, float(socket_ms) / 1000) if socket_ms else longest

# librdkafka's own log, through Python logging: an unreachable broker makes it
# log every reconnect (~20 lines a second), so each kind of line per broker is
# let through once per interval, with a count of what was held back.
LIBRDKAFKA_LOG = logging.getLogger("airflow_eos.librdkafka")
LOG_INTERVAL_S = 60.0


class _OncePerInterval(logging.Filter):
    """Passes the first record of each (facility, broker) per interval."""

    def __init__(self, interval_s: float):
        super().__init__()
        self.interval_s = interval_s
        self._seen: dict[tuple, tuple[float, int]] = {}  # key -> (last passed, held back since)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, *_librdkafka_key(record))
        now = time.monotonic()
        with self._lock:
            last, held = self._seen.get(key, (None, 0))
            if last is not None and now - last < self.interval_s:
                self._seen[key] = (last, held + 1)
                return False
            self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like it in the last {self.interval_s:.0f}s not shown)"
        return True


def _librdkafka_key(record: logging.LogRecord) -> tuple[str, str]:
    """(facility, broker) of a librdkafka log line ("%s [%s] %s": facility,
    client name, message) or of an error_cb record (its message)."""
    args = record.args if isinstance(record.args, tuple) else ()
    text = str(args[-1]) if args else record.getMessage()
    broker = re.search(r"([\w.\-]+:\d+)(?:/[\w.\-]+)?", text)
    return (str(args[0]) if len(args) == 3 else record.msg, broker.group(1) if broker else "")


LIBRDKAFKA_LOG.addFilter(_OncePerInterval(LOG_INTERVAL_S))


class ClientErrors:
    """A client's ``error_cb``: logs through LIBRDKAFKA_LOG (throttled) and
    remembers the last error, for the message that gives up on the cluster.
    Also usable as the client's ``logger`` (``log``), so that muting it
    silences both while the client is closed (core/consumer_pool.py)."""

    def __init__(self) -> None:
        self.last: str | None = None
        self.muted = False  # the client is being closed: what it says concerns no read

    def __call__(self, err) -> None:
        if self.muted:
            return
        text = err.str() if hasattr(err, "str") else str(err)
        # "1/1 brokers are down" follows the reason they are (refused, SASL
        # handshake failed, ...): it must not replace that reason in the message.
        if not (self.last and _all_brokers_down(err)):
            self.last = text
        LIBRDKAFKA_LOG.warning("Kafka client error: %s", text)

    def log(self, level: int, msg: str, *args) -> None:
        """A librdkafka log line, to LIBRDKAFKA_LOG."""
        if not self.muted:
            LIBRDKAFKA_LOG.log(level, msg, *args)

    def hint(self, bootstrap: str) -> str:
        """What to check, after a message that says Kafka did not answer."""
        last = f"; last client error: {self.last}" if self.last else ""
        return (f"{last}; check that bootstrap.servers ({bootstrap}) is right, that the brokers are up and "
                "reachable from this host, and the security settings")


def _all_brokers_down(err) -> bool:
    from confluent_kafka import KafkaError

    return hasattr(err, "code") and err.code() == KafkaError._ALL_BROKERS_DOWN


def client_logging() -> dict:
    """Settings every librdkafka client of the package gets: its log through
    LIBRDKAFKA_LOG (throttled) instead of raw lines on stderr, errors to a
    ClientErrors, and no line for each idle connection the broker closes."""
    return {"logger": LIBRDKAFKA_LOG, "error_cb": ClientErrors(), "log.connection.close": False}


def client_errors(config: dict) -> ClientErrors:
    """The ClientErrors of a config made by client_logging (a fresh one if the
    user set their own error_cb)."""
    errors = config.get("error_cb")
    return errors if isinstance(errors, ClientErrors) else ClientErrors()


# librdkafka's consumer-only properties (scope "C" in its CONFIGURATION.md; the
# unit tests check each against the installed librdkafka). A Kafka connection
# is often tuned for reading (fetch.wait.max.ms, isolation.level,
# auto.offset.reset, ...): a producer or an admin client given one logs a
# CONFWARN for it (the Kafka target's commits, verify's look at topic configs).
CONSUMER_ONLY = frozenset({
    "group.id", "group.instance.id", "group.protocol", "group.protocol.type", "group.remote.assignor",
    "partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms", "coordinator.query.interval.ms",
    "max.poll.interval.ms", "enable.auto.commit", "auto.commit.interval.ms", "auto.commit.enable",
    "enable.auto.offset.store", "auto.offset.reset", "queued.min.messages", "queued.max.messages.kbytes",
    "fetch.wait.max.ms", "fetch.queue.backoff.ms", "fetch.message.max.bytes", "max.partition.fetch.bytes",
    "fetch.max.bytes", "fetch.min.bytes", "fetch.error.backoff.ms", "isolation.level", "enable.partition.eof",
    "check.crcs", "consume.callback.max.messages", "offset.store.method", "offset.store.path",
    "offset.store.sync.interval.ms", "share.acknowledgement.mode",
})


def list_offsets(admin, tps: Iterable[tuple[str, int]], *, latest: bool = True, committed: bool = False,
                 timeout: float) -> Iterator[tuple[tuple[str, int], int]]:
    """((topic, partition), offset) of each of ``tps`` as the broker answers
    one ``ListOffsets`` request of ``admin``: the log's start, or its end as a
    read_committed reader sees it (the last stable offset: an open transaction
    holds it) or a read_uncommitted one (the high watermark). Raises
    KafkaException, or TimeoutError after ``timeout`` s; what was yielded
    before that stands."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka import TopicPartition as KafkaTopicPartition
    from confluent_kafka.admin import OffsetSpec

    spec = OffsetSpec.latest() if latest else OffsetSpec.earliest()
    isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    futures = admin.list_offsets({KafkaTopicPartition(t, p): spec for t, p in tps}, isolation_level=isolation,
                                 request_timeout=timeout)
    for tp, future in futures.items():
        yield (tp.topic, tp.partition), future.result(timeout).offset


# assign() never joins a group, but librdkafka insists on a group.id. One per
# process: consumers of equal settings are interchangeable (core/consumer_pool.py).
READER_GROUP = f"airflow-eos-reader-{uuid.uuid4().hex[:8]}"


def consumer_config(kafka_config: dict, **overrides) -> dict:
    """Client settings for reading planned ranges; no consumer group is joined."""
    if not kafka_config.get("bootstrap.servers"):
        raise ConfigurationError("Kafka configuration has no 'bootstrap.servers'")
    config = {**_DEFAULTS, **client_logging(), **kafka_config, **_FORCED, **overrides}
    config.setdefault("group.id", READER_GROUP)
    return config


def reader(config: dict, purpose: str = "a Kafka consumer"):
    """A confluent-kafka Consumer for ``config`` (see consumer_config). A
    configuration librdkafka refuses (an unknown property, a bad value: the
    Kafka connection's extra) is a ConfigurationError naming the property and
    what to change; any other client that cannot be created is
    SourceUnavailable, saying for what. Neither shows a secret of ``config``."""
    from confluent_kafka import Consumer, KafkaError, KafkaException

    try:
        return Consumer(config)
    except KafkaException as exc:
        text = without_secrets(str(exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError)
                                    else exc), config)
        where = f"{purpose} for bootstrap.servers {config.get('bootstrap.servers')!r}"
        if exc.args and isinstance(exc.args[0], KafkaError) and exc.args[0].code() == KafkaError._INVALID_ARG:
            text += "".join(f"; {name} names {path}, {problem}" for name, path, problem in missing_files(config))
            raise ConfigurationError(
                f"cannot create {where}: {text}. The client's settings are the Kafka connection's extra "
                "(librdkafka properties, see librdkafka's CONFIGURATION.md): correct or remove that property "
                "there") from None
        raise SourceUnavailable(f"cannot create {where}: {text}") from None


def missing_files(config: dict) -> list[tuple[str, str, str]]:
    """(setting, path, problem) for each file a client setting names
    (``ssl.ca.location``, ``ssl.key.location``, ``sasl.kerberos.keytab``, ...)
    that this process cannot read: librdkafka's own error names OpenSSL's
    reason, not the file."""
    import os

    found = []
    for name, value in config.items():
        if not (name.endswith(".location") or name.endswith(".keytab")) or not isinstance(value, str):
            continue
        if not os.path.exists(value):
            found.append((name, value, "which does not exist"))
        elif not os.access(value, os.R_OK):
            found.append((name, value, "which this process cannot read"))
    return found
