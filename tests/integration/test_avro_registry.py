"""Avro values in Confluent's wire format decoded against a real schema registry
(Apicurio Registry's Confluent-compatible API, started by the harness):
records of two writer schemas under one reader schema, and each kind of bad
record decoding to its reason, never to an error of the read; the registry
unreachable is an error of the read (SourceUnavailable)."""

from __future__ import annotations

import json
import struct
import uuid

import pytest

from airflow_eos.core.avro import AvroDecoder, latest_schema, registry_lookup
from airflow_eos.core.errors import ConfigurationError, SourceUnavailable
from harness.avro import BROKEN, V1, V2, client, register, serialize


@pytest.fixture
def topic(schema_registry) -> str:
    """A topic name of the test's own, its value subject (TopicNameStrategy) holding V1 then V2."""
    name = f"orders-{uuid.uuid4().hex[:8]}"
    register(schema_registry.address, f"{name}-value", V1)
    register(schema_registry.address, f"{name}-value", V2)
    return name


def test_records_of_two_writer_schemas_decode_under_the_latest_reader_schema(schema_registry, topic):
    url = schema_registry.address
    reader_id, reader = latest_schema(client(url), f"{topic}-value")
    assert json.loads(reader) == V2
    decoder = AvroDecoder(reader, registry_lookup(client(url)))
    old = decoder.decode(serialize(url, topic, V1, {"id": 1, "amount": 2.5}))
    new = decoder.decode(serialize(url, topic, V2, {"id": 2, "amount": 3.0, "note": "gift"}))
    assert old.error is None and old.record == {"id": 1, "amount": 2.5, "note": None}
    assert new.error is None and new.record == {"id": 2, "amount": 3.0, "note": "gift"}
    assert new.schema_id == reader_id and old.schema_id != reader_id


def test_each_kind_of_bad_record_decodes_to_its_reason(schema_registry, topic):
    url = schema_registry.address
    broken_topic = f"broken-{uuid.uuid4().hex[:8]}"
    broken_id = register(url, f"{broken_topic}-value", BROKEN)
    _, reader = latest_schema(client(url), f"{topic}-value")
    decoder = AvroDecoder(reader, registry_lookup(client(url)))
    good = serialize(url, topic, V2, {"id": 7, "amount": 1.0, "note": None})
    cases = {
        b'{"id": 7}': "not the wire format's magic byte",
        b"\x00\x00": "fewer than the wire format's 5-byte header",
        struct.pack(">bI", 0, 987654) + good[5:]: "has no schema of id 987654",
        struct.pack(">bI", 0, broken_id) + serialize(url, broken_topic, BROKEN, {"id": 1, "amount": "a"})[5:]:
            f"writer schema {broken_id} does not resolve to the reader schema",
        good[:-3]: "is not a record of writer schema",
        good + b"\x02": "1 bytes after a record",
    }
    for value, reason in cases.items():
        decoded = decoder.decode(value)
        assert decoded.record is None and reason in decoded.error, (value, decoded)
    assert decoder.decode(None).error.startswith("the value is null")
    assert decoder.decode(good).record == {"id": 7, "amount": 1.0, "note": None}


def test_a_registry_that_does_not_answer_fails_the_read(schema_registry, topic):
    from airflow_eos.embedded import free_port

    url = schema_registry.address
    good = serialize(url, topic, V2, {"id": 7, "amount": 1.0, "note": None})
    gone = f"http://127.0.0.1:{free_port()}/apis/ccompat/v6"
    decoder = AvroDecoder(json.dumps(V2), registry_lookup(client(gone)))
    with pytest.raises(SourceUnavailable, match="did not answer for schema id"):
        decoder.decode(good)
    with pytest.raises(SourceUnavailable):
        latest_schema(client(gone), f"{topic}-value")
    with pytest.raises(ConfigurationError, match="no subject"):
        latest_schema(client(url), "no-such-subject-value")


def test_a_writer_schema_is_asked_of_the_registry_once(schema_registry, topic):
    url = schema_registry.address
    asked: list[int] = []
    lookup = registry_lookup(client(url))

    def counting(schema_id: int):
        asked.append(schema_id)
        return lookup(schema_id)

    decoder = AvroDecoder(json.dumps(V2), counting)
    values = [serialize(url, topic, V1, {"id": i, "amount": 1.0}) for i in range(50)]
    assert all(decoder.decode(v).error is None for v in values)
    assert len(asked) == 1


def test_the_reader_schema_a_plan_freezes_is_the_latest_the_topics_agree_on(schema_registry):
    from airflow_eos.core.avro import latest_reader_schema

    url = schema_registry.address
    a, b, c = (f"orders-{uuid.uuid4().hex[:8]}" for _ in range(3))
    register(url, f"{a}-value", V1)
    register(url, f"{a}-value", V2)
    register(url, f"{b}-value", V2)
    register(url, f"{c}-value", V1)
    assert json.loads(latest_reader_schema({"url": url}, (f"{a}-value", f"{b}-value"))) == V2
    with pytest.raises(ConfigurationError, match="latest value schemas of the source's topics differ"):
        latest_reader_schema({"url": url}, (f"{a}-value", f"{c}-value"))
    with pytest.raises(ConfigurationError, match="has no subject .*give the source a reader_schema"):
        latest_reader_schema({"url": url}, ("nobody-value",))
    with pytest.raises(SourceUnavailable, match=r"registry at http://127\.0\.0\.1:9/x did not answer") as down:
        latest_reader_schema({"url": "http://eos:s3cr3t@127.0.0.1:9/x", "max.retries": 0}, (f"{a}-value",))
    assert "s3cr3t" not in str(down.value)


def test_the_harness_orders_decode_or_dead_letter_as_they_say(schema_registry, topic):
    """harness.avro.avro_orders (the e2e, chaos and bench topics' records): each
    record decodes under the subject's latest schema to what it says, or is
    poisoned with the reason it says; both writer schemas and every kind of
    poison are there."""
    from harness.avro import avro_orders

    url = schema_registry.address
    orders = avro_orders(url, f"{topic}-h", [(n % 3, 1_700_000_000_000 + n) for n in range(60)])
    _, reader = latest_schema(client(url), f"{topic}-h-value")
    decoder = AvroDecoder(reader, registry_lookup(client(url)))
    at = {}
    for partition, _, value in orders.records:
        at[(partition, sum(1 for k in at if k[0] == partition))] = decoder.decode(value)
    assert at.keys() == orders.decoded.keys() | orders.poisoned.keys()
    assert not orders.decoded.keys() & orders.poisoned.keys()
    for key, record in orders.decoded.items():
        assert at[key].record == record, key
    for key, reason in orders.poisoned.items():
        assert at[key].record is None and reason in at[key].error, (key, at[key])
    assert len(set(orders.poisoned.values())) == 3
    assert {d.schema_id for d in at.values() if d.record is not None} == {
        at[k].schema_id for k in orders.decoded} and len({at[k].schema_id for k in orders.decoded}) == 2
