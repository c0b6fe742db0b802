"""How the staging's writer encodes Arrow rows for COPY.

Binary COPY (PostgreSQL's own wire format, encoded from the Arrow buffers by
``pgpq``, a Rust encoder) when every staged column's Arrow type has a binary
form the column's type reads exactly as it would read the text of the value:
the server then parses no text at all (no numeric, timestamp or integer
input function runs), and this process formats no text. Otherwise CSV, as
before: the server's input functions decide, so any Arrow type a transform
gives still stages (text into an integer column, an int64 into an integer
column, a float into a numeric column ...), with the same refusals.

What stays the server's in binary too: a value the column's type cannot take
is refused by its receive function with the same error as its input function
(a numeric beyond the typmod, a varchar too long, a NUL byte in text, invalid
JSON for jsonb, a timestamp out of range), and the refusal names the column.
A refused COPY's ``line N`` is the row's physical line in CSV (values may span
lines), the row's number in binary: :func:`row_of_line` maps either back to
the row.

pyarrow and pgpq are imported inside the functions (DAG files import this
package at parse time).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_eos.core.errors import TargetError

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from psycopg import sql

# What PostgreSQL's binary receive of a NUL byte in text says (pg_verify_mbstr).
NUL_REFUSED = 'invalid byte sequence for encoding "UTF8": 0x00'


class CopyFormat(enum.Enum):
    """The COPY format of one chunk."""

    BINARY = "binary"
    CSV = "csv"


@dataclass
class CopyEncoder:
    """Encodes batches in one format, for any number of COPYs: each sends
    :meth:`header`, the batches' :meth:`encode`, then :meth:`trailer` (pgpq
    buffers what it encodes: the trailer flushes the rest). Build with
    :func:`encoder_for`."""

    format: CopyFormat
    schema: Any = None  # BINARY: the Arrow schema every batch is cast to (pa.Schema)
    make: Any = None  # BINARY: () -> a new pgpq encoder
    _pgpq: Any = None  # BINARY: the current COPY's

    @property
    def option(self) -> str:
        return "binary" if self.format is CopyFormat.BINARY else "csv"

    def header(self) -> bytes:
        if self.format is CopyFormat.CSV:
            return b""
        self._pgpq = self.make()
        return self._pgpq.write_header()

    def encode(self, batch: pa.RecordBatch | pa.Table) -> Any:
        """One batch (columns in the COPY's order) as COPY data: bytes or an Arrow buffer."""
        if self.format is CopyFormat.CSV:
            return _csv(batch)
        import pyarrow as pa

        if batch.schema != self.schema:
            batch = batch.cast(self.schema)
        batches = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
        return b"".join(self._pgpq.write_batch(b) for b in batches)

    def trailer(self) -> bytes:
        if self.format is CopyFormat.CSV:
            return b""
        data, self._pgpq = self._pgpq.finish(), None
        return data


def column_types(conn: psycopg.Connection, table: sql.Identifier) -> dict[str, str]:
    """A table's columns and their types' names (``pg_type.typname``), as
    :func:`encoder_for` takes them."""
    return dict(conn.execute(
        "SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
        " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
        (table.as_string(conn),)).fetchall())


def encoder_for(schema: pa.Schema, pg_types: Mapping[str, str]) -> CopyEncoder:
    """Binary when every field of ``schema`` (the COPY's columns, in order) has
    an exact binary form for its column's type (``pg_types``: column name ->
    ``pg_type.typname``), else CSV."""
    import pyarrow as pa

    fields, builders = [], {}
    for f in schema:
        chosen = _binary_field(f, pg_types.get(f.name))
        if chosen is None:
            return CopyEncoder(CopyFormat.CSV)
        field, builder = chosen
        fields.append(field)
        if builder is not None:
            builders[f.name] = builder
    import pgpq

    target = pa.schema(fields)

    def make():
        if not builders:
            return pgpq.ArrowToPostgresBinaryEncoder(target)
        encoders = {f.name: builders.get(f.name) or pgpq.ArrowToPostgresBinaryEncoder.infer_encoder(f)
                    for f in target}
        return pgpq.ArrowToPostgresBinaryEncoder.new_with_encoders(target, encoders)

    return CopyEncoder(CopyFormat.BINARY, target, make)


# PostgreSQL type -> the Arrow types whose binary form it reads as it reads their CSV text.
_INTEGERS = {"int2": (16,), "int4": (16, 32), "int8": (16, 32, 64)}
_STRINGS = ("text", "varchar", "jsonb")


def _binary_field(field: pa.Field, pg_type: str | None) -> tuple[pa.Field, Any] | None:
    """The field as pgpq must see it to write ``pg_type``'s binary form, and the
    pgpq encoder builder if not its default one; None: not exactly (use CSV)."""
    import pyarrow as pa

    t = field.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pg_type in _INTEGERS:
        if not pa.types.is_signed_integer(t) or t.bit_width not in _INTEGERS[pg_type]:
            return None  # a narrower column: its range is the server's to check, on the text
        width = {"int2": pa.int16(), "int4": pa.int32(), "int8": pa.int64()}[pg_type]
        return pa.field(field.name, width), None
    exact = {"bool": pa.types.is_boolean, "float4": pa.types.is_float32, "float8": pa.types.is_float64,
             "date": pa.types.is_date32, "bytea": lambda x: pa.types.is_binary(x) or pa.types.is_large_binary(x),
             "numeric": lambda x: pa.types.is_decimal128(x)}
    if pg_type in exact:
        return (pa.field(field.name, t), None) if exact[pg_type](t) else None
    if pg_type in ("timestamp", "timestamptz"):
        # Both read microseconds since 2000 in UTC, as the writer's UTC session
        # reads the CSV text of a naive or zoned value; nanoseconds are rounded
        # by the server from text, so they stay CSV.
        if not pa.types.is_timestamp(t) or t.unit == "ns":
            return None
        return pa.field(field.name, pa.timestamp(t.unit, t.tz)), None
    if pg_type in _STRINGS:
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            return None
        field = pa.field(field.name, t)
        if pg_type != "jsonb":
            return field, None
        import pgpq.encoders
        import pgpq.schema
        builder = (pgpq.encoders.StringEncoderBuilder if pa.types.is_string(t)
                   else pgpq.encoders.LargeStringEncoderBuilder)
        return field, builder.new_with_output(field, pgpq.schema.Jsonb())
    return None


def row_of_line(fmt: CopyFormat, table: pa.Table, line: int) -> int | None:
    """The row (0-based) of ``table`` that PostgreSQL numbers ``line`` in a COPY
    of it in ``fmt``. None when no row matches.

    Binary: the row's number. CSV: COPY counts physical lines, newlines inside
    quoted values included, except inside the first row (it learns the line
    ending at the first row's end).
    """
    n = table.num_rows
    if fmt is CopyFormat.BINARY:
        return line - 1 if 1 <= line <= n else None
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    newlines = np.zeros(n, dtype=np.int64)
    for column in table.columns:
        t = column.type
        if pa.types.is_dictionary(t):
            column, t = column.cast(t.value_type), t.value_type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            newlines += pc.fill_null(pc.count_substring(column, "\n"), 0).to_numpy(zero_copy_only=False)
    newlines[0] = 0
    lines = np.arange(1, n + 1) + np.cumsum(newlines)
    row = int(np.searchsorted(lines, line))
    return row if row < n and lines[row] == line else None


def _csv(batch: pa.RecordBatch | pa.Table) -> pa.Buffer:
    """Arrow → PostgreSQL CSV (nulls unquoted-empty, strings quoted)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    arrays = []
    for f, column in zip(batch.schema, batch.columns):
        t = f.type
        if pa.types.is_dictionary(t):
            column, t = column.cast(t.value_type), t.value_type
        if pa.types.is_timestamp(t) and t.tz is not None:
            # Arrow formats zoned timestamps ~20x slower; the instant's UTC wall
            # clock is the same instant in the writer's UTC session.
            column = column.cast(pa.timestamp(t.unit))
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            # bytea's hex input; Arrow's CSV writer refuses non-UTF-8 bytes
            column = pa.array([None if v is None else "\\x" + v.hex() for v in column.to_pylist()], pa.string())
        arrays.append(column)
    table = pa.Table.from_arrays(arrays, names=batch.schema.names)
    out = pa.BufferOutputStream()
    pacsv.write_csv(table, out, pacsv.WriteOptions(include_header=False))
    return out.getvalue()


def copy_texts(values: pa.Array | pa.ChunkedArray) -> list[str | None]:
    """Each value as the text COPY receives for it from :func:`_csv` (None for
    null): encoded by _csv itself and decoded as PostgreSQL's CSV input does
    (an unquoted empty field is null, a quoted one the empty string)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    payload = _csv(pa.table({"v": values}))
    parsed = pacsv.read_csv(
        pa.BufferReader(payload),
        read_options=pacsv.ReadOptions(column_names=["v"]),
        parse_options=pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(column_types={"v": pa.string()}, strings_can_be_null=True,
                                             null_values=[""], quoted_strings_can_be_null=False))
    texts = parsed.column("v").to_pylist()
    if len(texts) != len(values):
        raise TargetError(f"could not re-read {len(values)} values as COPY text (got {len(texts)})")
    return texts


def split_nul(texts: Sequence[str | None]) -> tuple[list[str | None], dict[int, str]]:
    """The texts a server can be asked about (a NUL byte cannot be sent as a
    text parameter: None in its place) and, by row, those holding one, shown
    with the NUL as ``\\x00``: every text type refuses them (NUL_REFUSED)."""
    nul = {i: t.replace("\x00", "\\x00") for i, t in enumerate(texts) if t is not None and "\x00" in t}
    return ([None if i in nul else t for i, t in enumerate(texts)] if nul else list(texts)), nul


__all__ = ["NUL_REFUSED", "CopyEncoder", "CopyFormat", "column_types", "copy_texts", "encoder_for", "row_of_line", "split_nul"]
