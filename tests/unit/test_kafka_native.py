"""Spark's own Kafka source reading a frozen plan: the options it is given and the
Kafka connection's librdkafka settings as the Java client's (no Spark here)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
from airflow_eos.spark.kafka_native import java_kafka_config, native_options

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
PLAN = WindowPlan(Window("p", T0, datetime(2026, 1, 1, 1, tzinfo=timezone.utc)), (
    PartitionRange("orders", 0, 10, 2_000), PartitionRange("orders", 3, 0, 5), PartitionRange("refunds", 1, 7, 9)))


def test_the_source_reads_exactly_the_plan_committed_with_headers_and_fails_on_data_loss():
    options = native_options(PLAN, {"bootstrap.servers": "b:9092", "fetch.wait.max.ms": 10},
                             max_records_per_task=500)
    assert json.loads(options["assign"]) == {"orders": [0, 3], "refunds": [1]}
    assert json.loads(options["startingOffsets"]) == {"orders": {"0": 10, "3": 0}, "refunds": {"1": 7}}
    assert json.loads(options["endingOffsets"]) == {"orders": {"0": 2_000, "3": 5}, "refunds": {"1": 9}}
    assert options["kafka.isolation.level"] == "read_committed"
    assert (options["failOnDataLoss"], options["includeHeaders"]) == ("true", "true")
    assert options["maxRecordsPerPartition"] == "500"
    assert options["kafka.bootstrap.servers"] == "b:9092"
    assert "kafka.fetch.wait.max.ms" not in options  # librdkafka's, not the Java client's
    assert options["kafka.max.partition.fetch.bytes"] == str(8 << 20)  # large fetches, unless the connection says
    assert native_options(PLAN, {"bootstrap.servers": "b", "max.partition.fetch.bytes": 1 << 20},
                          max_records_per_task=5)["kafka.max.partition.fetch.bytes"] == str(1 << 20)
    assert "subscribe" not in options and "subscribePattern" not in options


def test_librdkafka_settings_become_the_java_clients():
    java = java_kafka_config({
        "bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "alice", "sasl.password": 'p"w', "ssl.ca.location": "/etc/ca.pem",
        "enable.partition.eof": True, "group.id": "g", "isolation.level": "read_uncommitted",
        "fetch.queue.backoff.ms": 10, "client.id": "me"})
    assert java == {
        "bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            'username="alice" password="p\\"w";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": "/etc/ca.pem", "client.id": "me"}


def test_a_login_the_java_client_cannot_be_given_is_refused_and_no_servers_is_refused():
    with pytest.raises(ConfigurationError, match="sasl.jaas.config"):
        java_kafka_config({"bootstrap.servers": "b", "sasl.mechanism": "OAUTHBEARER", "sasl.username": "u"})
    with pytest.raises(ConfigurationError, match="bootstrap.servers"):
        native_options(PLAN, {}, max_records_per_task=10)
