"""A Kafka target's producer and admin client take the connection's settings
without the consumer-only ones (a target connection is often the source's,
tuned for reading), so librdkafka logs no CONFWARN for them in every commit.
Real librdkafka clients, no broker: creating one connects to nothing here."""

from __future__ import annotations

import io
import logging

from confluent_kafka import Producer

from airflow_eos.core.kafka_client import LIBRDKAFKA_LOG, client_logging
from airflow_eos.targets.kafka import client

# A value librdkafka accepts for each consumer-only property.
VALUES = {
    "group.id": "g", "group.instance.id": "i", "group.protocol": "classic", "group.protocol.type": "consumer",
    "group.remote.assignor": "uniform", "partition.assignment.strategy": "range", "session.timeout.ms": 45000,
    "heartbeat.interval.ms": 3000, "coordinator.query.interval.ms": 600000, "max.poll.interval.ms": 300000,
    "enable.auto.commit": False, "auto.commit.interval.ms": 5000, "auto.commit.enable": True,
    "enable.auto.offset.store": True, "auto.offset.reset": "earliest", "queued.min.messages": 100000,
    "queued.max.messages.kbytes": 65536, "fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 1000,
    "fetch.message.max.bytes": 1048576, "max.partition.fetch.bytes": 1048576, "fetch.max.bytes": 52428800,
    "fetch.min.bytes": 1, "fetch.error.backoff.ms": 500, "isolation.level": "read_committed",
    "enable.partition.eof": False, "check.crcs": False, "consume.callback.max.messages": 0,
    "offset.store.method": "broker", "offset.store.path": ".", "offset.store.sync.interval.ms": -1,
    "share.acknowledgement.mode": "implicit",
}


def config_warnings(make) -> list[str]:
    """The CONFWARN lines librdkafka logs when ``make(logger)`` builds a client."""
    out = io.StringIO()
    logger = logging.getLogger(f"test.kafka.{id(out)}")
    logger.handlers, logger.propagate, logger.level = [logging.StreamHandler(out)], False, logging.DEBUG
    made = make(logger)
    made.poll(0)
    del made
    return [line for line in out.getvalue().splitlines() if "CONFWARN" in line and "bootstrap.servers" not in line]


def test_the_list_is_librdkafkas_own():
    assert set(VALUES) == client.CONSUMER_ONLY
    for key, value in VALUES.items():
        warnings = config_warnings(lambda logger, k=key, v=value: Producer({k: v, "logger": logger}))
        # Each one is a consumer property to this librdkafka (or a deprecated consumer one).
        assert warnings and any(w in warnings[0] for w in ("is a consumer property", "is deprecated")), (key, warnings)


def test_a_producer_built_from_a_consumers_connection_warns_of_nothing():
    connection = {"bootstrap.servers": "", **VALUES, "client.id": "kept"}
    assert config_warnings(lambda logger: client.producer(connection, "tx-1", {"logger": logger})) == []
    settings = client._producer_client(connection)
    logging_keys = client_logging().keys()
    # the connection's own settings stay, beside the package's client logging
    assert {k: v for k, v in settings.items() if k not in logging_keys} == {"bootstrap.servers": "", "client.id": "kept"}
    assert client._client(connection)["fetch.wait.max.ms"] == 10  # consumers (the marker, verify) keep them


def test_the_targets_clients_log_through_the_package_not_stderr(capfd):
    """A target producer's librdkafka lines (TxnCoordinator reconnects, ...)
    go to airflow_eos.librdkafka, throttled, like the source's; a raw line on
    stderr bypasses the task log's formatting and its throttle."""
    for settings in (client._client({"bootstrap.servers": ""}), client._producer_client({"bootstrap.servers": ""})):
        assert settings["logger"] is LIBRDKAFKA_LOG and callable(settings["error_cb"])
    made = client.producer({"bootstrap.servers": "", "debug": "generic"}, "tx-1", {})
    made.poll(0)
    del made
    assert "rdkafka" not in capfd.readouterr().err


def test_the_packages_own_requests_wait_no_longer_than_the_clients_socket_timeout():
    from airflow_eos.core.kafka_client import request_timeout
    from airflow_eos.core.source import KafkaLog

    assert request_timeout({"bootstrap.servers": "b:9092"}, 30.0) == 30.0
    assert request_timeout({"socket.timeout.ms": 3000}, 30.0) == 3.0
    assert request_timeout({"socket.timeout.ms": "120000"}, 30.0) == 30.0
    assert KafkaLog({"bootstrap.servers": "127.0.0.1:1", "socket.timeout.ms": 2000}).timeout == 2.0
