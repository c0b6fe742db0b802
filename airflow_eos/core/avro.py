"""Decoding Kafka record values in Confluent's wire format (a zero magic byte, a
4-byte big-endian schema id, the Avro binary payload) against a fixed reader
schema, following Avro's schema resolution rules.

A writer schema is resolved by its id through the schema registry once and then
cached. What a record's bytes decide is never an error of the read: a value that
is not in the wire format, an id the registry does not know, a payload that is
not a record of its writer schema or one the reader schema cannot resolve --
each decodes to a ``Decoded`` with the reason, for the dead letters. What the
registry decides is: unreachable, or answering with an error other than "no such
schema", it raises SourceUnavailable, and the read fails (to be retried).

No confluent_kafka or fastavro import at module level: the core is imported by
processes that never decode Avro.
"""

from __future__ import annotations

import io
import json
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_eos.core.errors import ConfigurationError, SourceUnavailable

MAGIC_BYTE = 0
HEADER = struct.Struct(">bI")  # the magic byte, the schema id

# What a registry lookup answers: the writer schema's type (AVRO, PROTOBUF, JSON) and text, or None when the
# registry has no schema of that id.
SchemaLookup = Callable[[int], "tuple[str, str] | None"]


@dataclass(frozen=True)
class Decoded:
    """A value decoded (``record``) or the reason it could not be (``error``)."""

    record: dict | None = None
    error: str | None = None
    schema_id: int | None = None


def parse_schema(text: str, what: str = "schema") -> Any:
    """An Avro schema's JSON text as fastavro's parsed schema."""
    from fastavro import parse_schema as fastavro_parse
    from fastavro.schema import SchemaParseException, UnknownType

    try:
        return fastavro_parse(json.loads(text))
    except (ValueError, TypeError, KeyError, SchemaParseException, UnknownType) as exc:
        raise ConfigurationError(f"the {what} is not a valid Avro schema: {exc}") from exc


def split_wire_format(value: bytes | None) -> tuple[int, memoryview] | str:
    """``(schema id, payload)``, or the reason ``value`` is not in the wire format."""
    if value is None:
        return "the value is null, not Avro in Confluent's wire format"
    if len(value) < HEADER.size:
        return f"the value has {len(value)} bytes, fewer than the wire format's {HEADER.size}-byte header"
    magic, schema_id = HEADER.unpack_from(value)
    if magic != MAGIC_BYTE:
        return f"the value starts with byte {magic & 0xFF}, not the wire format's magic byte {MAGIC_BYTE}"
    return schema_id, memoryview(value)[HEADER.size:]


class AvroDecoder:
    """Decodes values against ``reader_schema`` (Avro JSON text), resolving each
    writer schema by id through ``lookup`` once. Safe to share between threads."""

    def __init__(self, reader_schema: str, lookup: SchemaLookup):
        self.reader_schema = reader_schema
        self._reader = parse_schema(reader_schema, "reader schema")
        self._lookup = lookup
        self._lock = threading.Lock()
        self._writers: dict[int, Any] = {}  # schema id -> parsed writer schema, or the reason there is none

    def writer(self, schema_id: int) -> Any:
        """The parsed writer schema of ``schema_id``, or a str: why there is none."""
        with self._lock:
            if schema_id in self._writers:
                return self._writers[schema_id]
        found = self._lookup(schema_id)  # SourceUnavailable passes: the registry decides nothing of the record
        if found is None:
            writer: Any = f"the schema registry has no schema of id {schema_id}"
        elif found[0].upper() != "AVRO":
            writer = f"schema {schema_id} is a {found[0]} schema, not Avro"
        else:
            text = found[1]
            try:
                writer = parse_schema(text, f"writer schema {schema_id}")
            except ConfigurationError as exc:
                writer = str(exc)
        with self._lock:
            self._writers[schema_id] = writer
        return writer

    def decode(self, value: bytes | None) -> Decoded:
        from fastavro import schemaless_reader
        from fastavro.read import SchemaResolutionError

        framed = split_wire_format(value)
        if isinstance(framed, str):
            return Decoded(error=framed)
        schema_id, payload = framed
        writer = self.writer(schema_id)
        if isinstance(writer, str):
            return Decoded(error=writer, schema_id=schema_id)
        stream = io.BytesIO(payload)
        try:
            record = schemaless_reader(stream, writer, self._reader)
        except SchemaResolutionError as exc:
            return Decoded(error=f"writer schema {schema_id} does not resolve to the reader schema: {exc}",
                           schema_id=schema_id)
        except (EOFError, ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError, struct.error) as exc:
            return Decoded(error=f"the payload is not a record of writer schema {schema_id}: "
                                 f"{type(exc).__name__}: {exc}", schema_id=schema_id)
        if stream.tell() != len(payload):
            return Decoded(error=f"the payload has {len(payload) - stream.tell()} bytes after a record of writer "
                                 f"schema {schema_id}", schema_id=schema_id)
        return Decoded(record=record, schema_id=schema_id)


# What the registry's messages advise: the stage fails and is retried; an operator checks this.
REGISTRY_ADVICE = ("check that the registry runs and that the source's eos_schema_registry connection points at "
                   "it; the read fails and is retried, nothing of it is published")
DEFAULT_TIMEOUT_S = 10


def registry_address(config: dict) -> str:
    """The registry URL of SchemaRegistryClient settings, without credentials: what messages name."""
    from urllib.parse import urlsplit, urlunsplit

    url = str(config.get("url") or "")
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host))


# SchemaRegistryClient's settings that are numbers (Spark options carry them as text)
NUMERIC_SETTINGS = frozenset({"timeout", "cache.capacity", "cache.latest.ttl.sec", "max.retries", "retries.wait.ms",
                              "retries.max.wait.ms"})


def registry_client(config: dict):
    """confluent-kafka's SchemaRegistryClient of ``config`` (a request timeout by default)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    settings = {key: float(value) if key in NUMERIC_SETTINGS and isinstance(value, str) else value
                for key, value in {"timeout": DEFAULT_TIMEOUT_S, **config}.items()}
    return SchemaRegistryClient(settings)


def registry_lookup(client, address: str = "") -> SchemaLookup:
    """A SchemaLookup over confluent-kafka's SchemaRegistryClient: None for an id
    the registry says it does not have; SourceUnavailable when it cannot answer.
    ``address``: the registry's URL without credentials, for the messages."""
    where = f" at {address}" if address else ""

    def lookup(schema_id: int) -> tuple[str, str] | None:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            schema = client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return None
            raise SourceUnavailable(f"the schema registry{where} answered schema id {schema_id} with {exc}: "
                                    f"{REGISTRY_ADVICE}") from exc
        except Exception as exc:  # the HTTP client's own errors: refused, timed out, TLS
            raise SourceUnavailable(f"the schema registry{where} did not answer for schema id {schema_id}: "
                                    f"{type(exc).__name__}: {exc}; {REGISTRY_ADVICE}") from exc
        return schema.schema_type or "AVRO", schema.schema_str

    return lookup


def latest_schema(client, subject: str, address: str = "") -> tuple[int, str]:
    """``(id, text)`` of the subject's latest version: the reader schema a plan is to freeze."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    where = f" at {address}" if address else ""
    try:
        registered = client.get_latest_version(subject)
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            raise ConfigurationError(f"the schema registry{where} has no subject {subject!r}: register the "
                                     "topic's value schema, or give the source a reader_schema") from exc
        raise SourceUnavailable(f"the schema registry{where} answered subject {subject!r} with {exc}") from exc
    except Exception as exc:
        raise SourceUnavailable(f"the schema registry{where} did not answer for subject {subject!r}: "
                                f"{type(exc).__name__}: {exc}") from exc
    return registered.schema_id, registered.schema.schema_str


def latest_reader_schema(config: dict, subjects: tuple[str, ...]) -> str:
    """The reader schema a plan freezes when the source names none: the latest
    schema of each subject, which must be one record schema for them all."""
    client, address = registry_client(config), registry_address(config)
    found = {subject: latest_schema(client, subject, address) for subject in subjects}
    texts = {json.dumps(json.loads(text), sort_keys=True) for _, text in found.values()}
    if len(texts) > 1:
        raise ConfigurationError(
            "the latest value schemas of the source's topics differ ("
            + ", ".join(f"{subject}: id {schema_id}" for subject, (schema_id, _) in found.items())
            + "): one reader schema decodes a window; give the source a reader_schema they all resolve to")
    schema = json.loads(next(iter(found.values()))[1])
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigurationError(f"the latest schema of {subjects[0]!r} is not an Avro record: give the source "
                                 "a reader_schema that is one")
    return json.dumps(schema, separators=(",", ":"))
