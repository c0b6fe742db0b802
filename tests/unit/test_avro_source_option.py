"""KafkaSource's Avro option: value_format (an enum, its string accepted), the
registry connection it needs, and a reader schema that must be a record."""

from __future__ import annotations

import json

import pytest

from airflow_eos import KafkaSource, ValueFormat
from airflow_eos.core.errors import ConfigurationError

ORDER = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}


def test_raw_is_the_default():
    source = KafkaSource(topics=["orders"])
    assert source.value_format is ValueFormat.RAW and not source.is_avro
    assert source.reader_schema is None and source.schema_registry_conn_id is None


@pytest.mark.parametrize("given", ["avro", "AVRO", ValueFormat.AVRO])
def test_avro_as_a_string_or_the_enum(given):
    source = KafkaSource(topics=["b", "a"], value_format=given, schema_registry_conn_id="schema_registry_default")
    assert source.value_format is ValueFormat.AVRO and source.is_avro
    assert source.reader_schema is None  # the latest of each subject, at plan time
    assert source.value_subjects() == ("a-value", "b-value")


def test_an_unknown_format_is_refused():
    with pytest.raises(ConfigurationError, match="value_format must be one of"):
        KafkaSource(topics=["orders"], value_format="protobuf")


def test_avro_needs_a_registry_connection():
    with pytest.raises(ConfigurationError, match="needs schema_registry_conn_id"):
        KafkaSource(topics=["orders"], value_format="avro")


@pytest.mark.parametrize("extra", [{"schema_registry_conn_id": "r"}, {"reader_schema": ORDER}])
def test_avro_settings_on_a_raw_source_are_refused(extra):
    with pytest.raises(ConfigurationError, match="value_format='avro'"):
        KafkaSource(topics=["orders"], **extra)


@pytest.mark.parametrize("schema", [ORDER, json.dumps(ORDER), json.dumps(ORDER, indent=2)])
def test_a_reader_schema_as_dict_or_text_is_kept_as_compact_json(schema):
    source = KafkaSource(topics=["orders"], value_format="avro", schema_registry_conn_id="r", reader_schema=schema)
    assert json.loads(source.reader_schema) == ORDER and "\n" not in source.reader_schema


@pytest.mark.parametrize("schema", ['"long"', {"type": "enum", "name": "E", "symbols": ["A"]}, "{not json", [1]])
def test_a_reader_schema_that_is_not_a_record_is_refused(schema):
    with pytest.raises(ConfigurationError, match="reader_schema"):
        KafkaSource(topics=["orders"], value_format="avro", schema_registry_conn_id="r", reader_schema=schema)


def test_the_repr_names_the_format_not_the_schema():
    source = KafkaSource(topics=["orders"], value_format="avro", schema_registry_conn_id="r", reader_schema=ORDER)
    assert "value_format='avro'" in repr(source) and "reader_schema=given" in repr(source)
