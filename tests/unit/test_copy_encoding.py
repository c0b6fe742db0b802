"""Which COPY format the PostgreSQL writer picks for a chunk, and how a refused
COPY's line maps back to a row (pure logic; the server's side is in
tests/integration/test_stage_binary_copy.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_eos.staging.encoding import CopyFormat, encoder_for, row_of_line, split_nul

ORDERS = {"order_id": "text", "customer": "text", "amount": "numeric", "eos_topic": "text",
          "eos_partition": "int4", "eos_offset": "int8", "eos_pipeline": "text", "eos_window_start": "timestamptz"}


def orders_schema(**override):
    fields = {"order_id": pa.string(), "customer": pa.large_string(), "amount": pa.decimal128(12, 2),
              "eos_topic": pa.string(), "eos_partition": pa.int32(), "eos_offset": pa.int64(),
              "eos_pipeline": pa.dictionary(pa.int32(), pa.string()),
              "eos_window_start": pa.timestamp("us", tz="UTC")}
    fields.update(override)
    return pa.schema(list(fields.items()))


def test_the_orders_window_is_a_binary_copy():
    encoder = encoder_for(orders_schema(), ORDERS)
    assert (encoder.format, encoder.option) == (CopyFormat.BINARY, "binary")
    assert encoder.schema.field("eos_pipeline").type == pa.string()  # dictionaries decoded


@pytest.mark.parametrize("column, arrow_type", [
    ("eos_partition", pa.int64()),  # narrower column: the server checks the range
    ("eos_offset", pa.uint32()),
    ("eos_offset", pa.string()),  # the server parses the text
    ("amount", pa.float64()),  # a float's text, not its binary value, is what numeric must round
    ("eos_window_start", pa.timestamp("ns", tz="UTC")),  # the server rounds nanoseconds
    ("order_id", pa.binary()),
])
def test_a_type_without_an_exact_binary_form_keeps_the_chunk_csv(column, arrow_type):
    assert encoder_for(orders_schema(**{column: arrow_type}), ORDERS).format is CopyFormat.CSV


def test_a_column_type_without_a_binary_form_here_keeps_the_chunk_csv():
    assert encoder_for(orders_schema(), {**ORDERS, "customer": "citext"}).format is CopyFormat.CSV
    assert encoder_for(orders_schema(), {**ORDERS, "customer": "json"}).format is CopyFormat.CSV


def test_wider_columns_take_narrower_integers_in_binary():
    encoder = encoder_for(orders_schema(eos_offset=pa.int16()), ORDERS)
    assert encoder.format is CopyFormat.BINARY and encoder.schema.field("eos_offset").type == pa.int64()
    batch = pa.record_batch({"eos_offset": pa.array([1, None, -3], pa.int16())})
    binary = encoder_for(batch.schema, {"eos_offset": "int8"})
    payload = binary.header() + binary.encode(batch) + binary.trailer()
    # header (19 bytes), then per row: field count, then length + big-endian int8 or -1 for null
    rows = payload[19:-2]
    assert rows == (b"\x00\x01" + b"\x00\x00\x00\x08" + (1).to_bytes(8, "big", signed=True)
                    + b"\x00\x01" + b"\xff\xff\xff\xff"
                    + b"\x00\x01" + b"\x00\x00\x00\x08" + (-3).to_bytes(8, "big", signed=True))


def test_a_refused_line_is_the_row_number_in_binary_and_the_physical_line_in_csv():
    table = pa.table({"note": ["a", "b\nc", "d", "e\n\nf", "g"]})
    assert [row_of_line(CopyFormat.BINARY, table, line) for line in (1, 3, 5, 6, 0)] == [0, 2, 4, None, None]
    # CSV: a row's line is the last physical line it spans (the second row: 2-3, the fourth: 5-7)
    assert [row_of_line(CopyFormat.CSV, table, line) for line in (1, 3, 4, 7, 8, 2)] == [0, 1, 2, 3, 4, None]


def test_texts_with_a_nul_are_refused_without_asking_the_server():
    asked, nul = split_nul(["a", None, "b\x00c", ""])
    assert asked == ["a", None, None, ""] and nul == {2: "b\\x00c"}
