"""The columns an Avro reader schema decodes to, for the stage's reader: the
record's top-level fields as Spark columns (Avro's types mapped as Spark's own
``from_avro`` maps them) and one string column with the reason a value did not
decode (null for a decoded one), filled batch by batch from the values of the
Kafka rows by :class:`~airflow_eos.core.avro.AvroDecoder`.

The mapping is decided by the reader schema alone, which is frozen with the
window's plan: every rerun of a window has the same columns.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from airflow_eos.core.avro import AvroDecoder
from airflow_eos.core.errors import ConfigurationError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

# the column with the reason a value did not decode; null when it did
DECODE_ERROR_COLUMN = "eos_decode_error"

PRIMITIVES: dict[str, DataType] = {
    "boolean": BooleanType(), "int": IntegerType(), "long": LongType(), "float": FloatType(),
    "double": DoubleType(), "bytes": BinaryType(), "string": StringType(),
}
LOGICAL: dict[str, DataType] = {
    "date": DateType(), "timestamp-millis": TimestampType(), "timestamp-micros": TimestampType(),
}


def spark_type(schema: Any, named: dict[str, DataType]) -> tuple[DataType, bool]:
    """``(Spark type, nullable)`` of an Avro schema (JSON form); ``named``: the
    named types (records, enums, fixed) defined so far, by full name."""
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise ConfigurationError(f"the union {json.dumps(schema)} has no column type: only a union of null "
                                     "and one other type decodes to a column")
        return spark_type(branches[0], named)[0], len(branches) != len(schema)
    if isinstance(schema, str):
        if schema in PRIMITIVES:
            return PRIMITIVES[schema], False
        if schema in named:
            return named[schema], False
        raise ConfigurationError(f"the Avro type {schema!r} has no column type here")
    kind, logical = schema["type"], schema.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        found: DataType = DecimalType(schema["precision"], schema.get("scale", 0))
    elif logical in LOGICAL:
        found = LOGICAL[logical]
    elif kind == "record":
        found = StructType([StructField(f["name"], *spark_type(f["type"], named)) for f in schema["fields"]])
    elif kind == "enum":
        found = StringType()
    elif kind == "fixed":
        found = BinaryType()
    elif kind == "array":
        element, nullable = spark_type(schema["items"], named)
        found = ArrayType(element, nullable)
    elif kind == "map":
        value, nullable = spark_type(schema["values"], named)
        found = MapType(StringType(), value, nullable)
    else:
        return spark_type(kind, named)
    if kind in ("record", "enum", "fixed"):
        named[_full_name(schema)] = found
        named[schema["name"]] = found
    return found, False


def _full_name(schema: dict) -> str:
    name, namespace = schema["name"], schema.get("namespace")
    return f"{namespace}.{name}" if namespace and "." not in name else name


def decoded_fields(reader_schema: str) -> StructType:
    """The columns a reader schema (a record) decodes to, then DECODE_ERROR_COLUMN."""
    schema = json.loads(reader_schema)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigurationError("the reader schema of an Avro source must be a record: its fields are the columns")
    record, _ = spark_type(schema, {})
    fields = [StructField(f.name, f.dataType, True) for f in record.fields]  # null where the value did not decode
    if DECODE_ERROR_COLUMN in record.fieldNames():
        raise ConfigurationError(f"the reader schema has a field named {DECODE_ERROR_COLUMN!r}, the decoder's own")
    return StructType([*fields, StructField(DECODE_ERROR_COLUMN, StringType(), True)])


def decode_values(decoder: AvroDecoder, values: Sequence[bytes | None], fields: StructType) -> list["pa.Array"]:
    """Arrow arrays of ``fields`` (decoded_fields of the decoder's reader
    schema) for ``values``: a decoded value fills its row, one that did not is
    null in every field and has its reason in DECODE_ERROR_COLUMN."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    names = fields.fieldNames()[:-1]
    columns: list[list] = [[] for _ in names]
    errors: list[str | None] = []
    for value in values:
        decoded = decoder.decode(value)
        record = decoded.record or {}
        for column, name in zip(columns, names):
            column.append(record.get(name))
        errors.append(decoded.error)
    arrays = [pa.array(column, type=to_arrow_type(field.dataType, timezone="UTC"))
              for column, field in zip(columns, fields.fields)]
    return [*arrays, pa.array(errors, type=pa.string())]


def source_schema(kafka_schema: StructType, reader_schema: str | None) -> StructType:
    """The eos_kafka source's rows: Spark's Kafka source columns, then (an Avro
    source) the columns the reader schema decodes to."""
    if reader_schema is None:
        return kafka_schema
    decoded = decoded_fields(reader_schema)
    clash = set(decoded.fieldNames()) & set(kafka_schema.fieldNames())
    if clash:
        raise ConfigurationError(f"the reader schema's fields {sorted(clash)} are columns of the Kafka record too")
    return StructType([*kafka_schema.fields, *decoded.fields])


_DECODERS: dict[tuple[str, tuple[tuple[str, str], ...]], AvroDecoder] = {}
_DECODERS_LOCK = threading.Lock()


def registry_decoder(reader_schema: str, registry_config: dict[str, str]) -> AvroDecoder:
    """The decoder of this process for ``reader_schema`` over the registry of
    ``registry_config`` (SchemaRegistryClient's settings: ``url``, ...): one per
    process, so a Python worker that reads several tasks resolves each writer
    schema id once (a registered id's schema never changes)."""
    from airflow_eos.core.avro import registry_address, registry_client, registry_lookup

    key = (reader_schema, tuple(sorted((k, str(v)) for k, v in registry_config.items())))
    with _DECODERS_LOCK:
        decoder = _DECODERS.get(key)
        if decoder is None:
            client = registry_client(dict(registry_config))
            decoder = _DECODERS[key] = AvroDecoder(reader_schema,
                                                   registry_lookup(client, registry_address(registry_config)))
        return decoder


def with_decoded(batch: "pa.RecordBatch", decoder: AvroDecoder, schema: StructType) -> "pa.RecordBatch":
    """``batch`` (Kafka columns) with the decoded columns of its values appended;
    ``schema``: source_schema's."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    decoded = StructType(schema.fields[batch.num_columns:])
    arrays = decode_values(decoder, batch.column("value").to_pylist(), decoded)
    return pa.RecordBatch.from_arrays([*batch.columns, *arrays], schema=to_arrow_schema(schema, timezone="UTC"))


def decoded_apart(records: "DataFrame") -> tuple["DataFrame", "DataFrame"]:
    """An Avro source's rows as (those that decoded, without DECODE_ERROR_COLUMN:
    what the transform receives; those that did not: dead letters)."""
    from pyspark.sql import functions as F

    failed = F.col(DECODE_ERROR_COLUMN).isNotNull()
    return records.where(~failed).drop(DECODE_ERROR_COLUMN), records.where(failed)


def with_decode_failures(out: "DataFrame", failed: "DataFrame") -> "DataFrame":
    """The transform's output ``out`` and, after its rows, a dead letter per row
    of ``failed`` (decoded_apart's): the decoder's reason as ``eos_error``, the
    record's lineage and raw key and value, every other column null. ``out``
    must have the lineage columns (a dead letter names its record); it gains an
    ``eos_error`` column if it has none."""
    from pyspark.sql import functions as F

    from airflow_eos.core.columns import LINEAGE_COLUMNS
    from airflow_eos.spark.udf import ERROR_COLUMN

    names = {c.lower(): c for c in out.columns}
    missing = [c for c in LINEAGE_COLUMNS if c not in names]
    if missing:
        raise ConfigurationError(f"the transform of an Avro source must return the lineage columns "
                                 f"{list(LINEAGE_COLUMNS)} (it lacks {missing}): a record that did not decode "
                                 "is a dead letter, which names its record by them")
    if ERROR_COLUMN not in names:
        out = out.withColumn(ERROR_COLUMN, F.lit(None).cast("string"))
        names[ERROR_COLUMN] = ERROR_COLUMN
    sources = {ERROR_COLUMN: DECODE_ERROR_COLUMN, "key": "key", "value": "value",
               **dict(zip(LINEAGE_COLUMNS, ("topic", "partition", "offset")))}
    kinds = dict(out.dtypes)
    letters = failed.select([
        (F.col(sources[c.lower()]) if c.lower() in sources else F.lit(None)).cast(kinds[c]).alias(c)
        for c in out.columns])
    return out.unionByName(letters)
