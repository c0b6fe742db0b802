"""Decoding Confluent-framed Avro values (core/avro.py) into the stage reader's
columns (spark/avro_columns.py), with writer schemas from an in-memory lookup;
tests/integration/test_avro_registry.py runs the decoder against a real registry."""

from __future__ import annotations

import datetime as dt
import io
import json
import struct
from decimal import Decimal

import pytest

from airflow_eos.core.avro import AvroDecoder, split_wire_format
from airflow_eos.core.errors import ConfigurationError, SourceUnavailable

V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]}
V2 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "amount", "type": "double"},
    {"name": "note", "type": ["null", "string"], "default": None}]}
WIDE = {"type": "record", "name": "Wide", "fields": [
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "where", "type": {"type": "record", "name": "Place", "fields": [{"name": "city", "type": "string"}]}},
    {"name": "from", "type": ["null", "Place"], "default": None}]}


def framed(schema_id: int, schema: dict, record: dict) -> bytes:
    from fastavro import parse_schema, schemaless_writer

    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), record)
    return struct.pack(">bI", 0, schema_id) + out.getvalue()


def lookup_of(schemas: dict[int, dict], asked: list | None = None):
    def lookup(schema_id: int):
        if asked is not None:
            asked.append(schema_id)
        return ("AVRO", json.dumps(schemas[schema_id])) if schema_id in schemas else None
    return lookup


def test_the_wire_format_is_a_zero_byte_and_a_big_endian_id():
    assert split_wire_format(b"\x00\x00\x00\x01\x02rest")[0] == 258
    assert "magic byte" in split_wire_format(b"\x01\x00\x00\x00\x01")
    assert "fewer than" in split_wire_format(b"\x00\x00")
    assert "null" in split_wire_format(None)


def test_old_records_resolve_to_the_reader_schema_and_writers_are_looked_up_once():
    asked: list[int] = []
    decoder = AvroDecoder(json.dumps(V2), lookup_of({1: V1, 2: V2}, asked))
    values = [framed(1, V1, {"id": i, "amount": 1.5}) for i in range(3)] + [framed(2, V2, {"id": 9, "amount": 2.0,
                                                                                          "note": "n"})]
    decoded = [decoder.decode(v) for v in values]
    assert [d.record for d in decoded] == [{"id": i, "amount": 1.5, "note": None} for i in range(3)] + [
        {"id": 9, "amount": 2.0, "note": "n"}]
    assert [d.schema_id for d in decoded] == [1, 1, 1, 2] and asked == [1, 2]


def test_bad_values_decode_to_reasons():
    other = {"type": "record", "name": "Order", "namespace": "shop", "fields": [{"name": "id", "type": "string"}]}
    lookup = lookup_of({1: V1, 3: other})
    decoder = AvroDecoder(json.dumps(V2), lambda i: ("PROTOBUF", "syntax") if i == 4 else lookup(i))
    good = framed(1, V1, {"id": 1, "amount": 1.0})
    assert "no schema of id 7" in decoder.decode(b"\x00\x00\x00\x00\x07" + good[5:]).error
    assert "does not resolve" in decoder.decode(framed(3, other, {"id": "x"})).error
    assert "PROTOBUF schema, not Avro" in decoder.decode(b"\x00\x00\x00\x00\x04" + good[5:]).error
    assert "not a record of writer schema 1" in decoder.decode(good[:-1]).error
    assert "bytes after a record" in decoder.decode(good + b"\x00").error


def test_an_unreachable_registry_is_an_error_of_the_read_not_a_dead_letter():
    def down(schema_id: int):
        raise SourceUnavailable("no answer")

    with pytest.raises(SourceUnavailable):
        AvroDecoder(json.dumps(V2), down).decode(framed(1, V1, {"id": 1, "amount": 1.0}))


def test_a_reader_schema_that_is_no_avro_is_refused():
    with pytest.raises(ConfigurationError, match="reader schema"):
        AvroDecoder('{"type": "nope"}', lookup_of({}))


def test_the_columns_of_a_reader_schema():
    from pyspark.sql.types import ArrayType, DateType, DecimalType, MapType, StringType, StructType, TimestampType

    from airflow_eos.spark.avro_columns import DECODE_ERROR_COLUMN, decoded_fields

    fields = decoded_fields(json.dumps(WIDE))
    types = {f.name: f.dataType for f in fields.fields}
    assert fields.fieldNames()[-1] == DECODE_ERROR_COLUMN and all(f.nullable for f in fields.fields)
    assert types["day"] == DateType() and types["at"] == TimestampType() and types["price"] == DecimalType(9, 2)
    assert types["kind"] == StringType() and isinstance(types["tags"], ArrayType)
    assert isinstance(types["attrs"], MapType) and isinstance(types["where"], StructType)
    assert types["from"] == types["where"]
    with pytest.raises(ConfigurationError, match="union"):
        decoded_fields(json.dumps({"type": "record", "name": "R",
                                   "fields": [{"name": "u", "type": ["int", "string"]}]}))
    with pytest.raises(ConfigurationError, match="must be a record"):
        decoded_fields('"string"')


def test_a_batch_of_values_decodes_to_arrow_columns_with_the_reasons():
    import pyarrow as pa

    from airflow_eos.spark.avro_columns import decode_values, decoded_fields

    record = {"day": dt.date(2026, 1, 2), "at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
              "price": Decimal("12.34"), "kind": "B", "tags": ["x"], "attrs": {"a": 1}, "where": {"city": "Oslo"},
              "from": None}
    decoder = AvroDecoder(json.dumps(WIDE), lookup_of({5: WIDE}))
    fields = decoded_fields(json.dumps(WIDE))
    arrays = decode_values(decoder, [framed(5, WIDE, record), b"junk!", None], fields)
    table = pa.Table.from_arrays(arrays, names=fields.fieldNames())
    rows = table.to_pylist()
    assert rows[0]["price"] == Decimal("12.34") and rows[0]["where"] == {"city": "Oslo"}
    assert rows[0]["at"] == record["at"] and rows[0]["eos_decode_error"] is None
    assert all(v is None for k, v in rows[1].items() if k != "eos_decode_error")
    assert "magic byte" in rows[1]["eos_decode_error"]
    assert rows[2]["eos_decode_error"].startswith("the value is null")
