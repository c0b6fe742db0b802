"""Avro test data in Confluent's wire format, written as a producer with
confluent-kafka's AvroSerializer writes it, against the tests' real schema
registry (the ``schema_registry`` fixture): the schemas, the serializer, and
:func:`avro_orders`, a topic's worth of orders of two writer schemas with
poisoned records of each kind, and what each record must become, by lineage.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

V1 = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"},
                                                      {"name": "amount", "type": "double"}]}
# a compatible change: a field with a default
V2 = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"},
                                                      {"name": "amount", "type": "double"},
                                                      {"name": "note", "type": ["null", "string"], "default": None}]}
# not resolvable to V2: amount is a string
BROKEN = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"},
                                                          {"name": "amount", "type": "string"}]}
# A schema id no registry of the tests holds (Apicurio numbers its ids from 1).
UNKNOWN_ID = 2_000_000_001

# The poisoned records of avro_orders, and what their dead letter's reason says.
NOT_WIRE_FORMAT = "not the wire format's magic byte"
UNKNOWN_SCHEMA = f"has no schema of id {UNKNOWN_ID}"
UNRESOLVABLE = "does not resolve to the reader schema"


@functools.cache
def client(url: str):
    """The registry's client, one per URL: each new one costs ~40 ms of CPU (its HTTP
    clients' TLS contexts), and a test serializes values by the dozen."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url})


def register(registry_url: str, subject: str, schema: dict) -> int:
    from confluent_kafka.schema_registry import Schema

    return client(registry_url).register_schema(subject, Schema(json.dumps(schema), "AVRO"))


def serialize(registry_url: str, subject_topic: str, schema: dict, record: dict) -> bytes:
    """What a producer with confluent-kafka's AvroSerializer writes (the schema registered already)."""
    return serializer(registry_url, schema)(record, subject_topic)


def serializer(registry_url: str, schema: dict):
    """``serialize(record, topic) -> bytes`` of one writer schema: confluent-kafka's
    AvroSerializer (the schema registered already), for many records."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    avro = AvroSerializer(client(registry_url), json.dumps(schema),
                          conf={"auto.register.schemas": False, "use.latest.version": False})
    return lambda record, topic: avro(record, SerializationContext(topic, MessageField.VALUE))


def values_then_each_bad_kind(registry_url: str, topic: str, good: int) -> list[tuple[bytes, dict | str]]:
    """``good`` orders, the first half of writer schema V1 and the rest of V2
    (registered under the topic's value subject in that order), then one value
    of each kind of bad record: not the wire format, a schema id the registry
    does not have, a writer schema (BROKEN) not resolvable to V2, and a V2
    value cut short. Each with what it must become: the row decoded under V2,
    or a fragment of its dead letter's reason."""
    register(registry_url, f"{topic}-value", V1)
    register(registry_url, f"{topic}-value", V2)
    broken_id = register(registry_url, f"{topic}-broken-value", BROKEN)
    of_v1, of_v2 = serializer(registry_url, V1), serializer(registry_url, V2)  # one schema lookup each
    values: list[tuple[bytes, dict | str]] = []
    for i in range(good):
        record = {"id": i, "amount": i / 4} if i < good // 2 else {"id": i, "amount": i / 4, "note": f"n{i}"}
        values.append(((of_v1 if i < good // 2 else of_v2)(record, topic), {"note": None, **record}))
    a_v2_value = of_v2({"id": 0, "amount": 0.0, "note": None}, topic)
    broken = serialize(registry_url, f"{topic}-broken", BROKEN, {"id": 1, "amount": "x"})
    return values + [(b'{"id": 1}', "magic byte"),
                     (struct.pack(">bI", 0, 424242) + a_v2_value[5:], "no schema of id 424242"),
                     (struct.pack(">bI", 0, broken_id) + broken[5:], "does not resolve"),
                     (a_v2_value[:-2], "not a record of writer schema")]


def order(n: int, schema: dict) -> dict:
    """Order ``n`` as a record of writer schema V1 or V2."""
    record = {"id": n, "amount": (n % 997) + (n % 100) / 100}
    return record if schema is V1 else {**record, "note": f"order {n}" if n % 3 else None}


def poison(n: int) -> str | None:
    """Which poisoned record (its reason) order ``n`` is instead of an order, if any:
    of every 13, one not in the wire format, one of a schema id the registry does
    not know, one of a writer schema the reader schema (V2) cannot resolve."""
    return {5: NOT_WIRE_FORMAT, 8: UNKNOWN_SCHEMA, 11: UNRESOLVABLE}.get(n % 13)


@dataclass
class AvroOrders:
    """A topic's Avro records and what each must become, by lineage: a row of
    ``decoded`` (the record under the reader schema V2) or a dead letter whose
    reason says ``poisoned``'s fragment. Keyed by (partition, offset): produced
    into an empty topic in this order, the offsets are the records' places."""

    topic: str
    records: list[tuple[int, int, bytes]] = field(default_factory=list)  # (partition, timestamp ms, value)
    decoded: dict[tuple[int, int], dict] = field(default_factory=dict)
    poisoned: dict[tuple[int, int], str] = field(default_factory=dict)

    def lineage(self, offsets: Iterable[tuple[int, int]]) -> tuple[dict, dict]:
        """``(decoded, poisoned)`` of the records at ``offsets`` ((partition, offset) pairs)."""
        wanted = set(offsets)
        return ({k: v for k, v in self.decoded.items() if k in wanted},
                {k: v for k, v in self.poisoned.items() if k in wanted})


def avro_orders(registry_url: str, topic: str, stamped: Iterable[tuple[int, int]]) -> AvroOrders:
    """Orders for ``topic`` at ``stamped`` ((partition, timestamp ms), in producing
    order): the n-th is order n of writer schema V1 (even n) or V2 (odd n), or the
    poisoned record :func:`poison` says. Registers V1 then V2 under the topic's
    value subject (TopicNameStrategy: V2 is the reader schema a plan freezes) and
    BROKEN under a subject of its own. Deterministic but for the registry's ids."""
    register(registry_url, f"{topic}-value", V1)
    register(registry_url, f"{topic}-value", V2)
    broken_topic = f"{topic}-broken"
    register(registry_url, f"{broken_topic}-value", BROKEN)
    schemas = (V1, V2)
    writers = [serializer(registry_url, V1), serializer(registry_url, V2)]
    broken = serializer(registry_url, BROKEN)
    out = AvroOrders(topic)
    next_offset: dict[int, int] = {}
    for n, (partition, ts) in enumerate(stamped):
        offset = next_offset.get(partition, 0)
        next_offset[partition] = offset + 1
        schema = schemas[n % 2]
        good = writers[n % 2](order(n, schema), topic)
        reason = poison(n)
        if reason is None:
            value = good
            out.decoded[(partition, offset)] = {"note": None, **order(n, schema)}
        elif reason == NOT_WIRE_FORMAT:
            value = json.dumps(order(n, V1)).encode()
        elif reason == UNKNOWN_SCHEMA:
            value = struct.pack(">bI", 0, UNKNOWN_ID) + good[5:]
        else:
            value = broken({"id": n, "amount": str(n)}, broken_topic)  # framed with BROKEN's id
        if reason is not None:
            out.poisoned[(partition, offset)] = reason
        out.records.append((partition, ts, value))
    return out
