"""The PostgreSQL stage writer's binary COPY (staging/encoding.py), on a
real PostgreSQL: hostile values arrive exactly as the CSV path delivers them,
and every value the server refuses becomes a counted dead letter with its
lineage, nothing else lost or duplicated. No Spark: the write task's own code
(TaskStager) is driven with Arrow batches, as a Spark worker drives it. (Nulls
in a NOT NULL column are dead-lettered before the writer, by the stage job:
test_spark_stage.py::test_bad_records_become_dead_letters..., binary now.)"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from airflow_eos.core.ledger import Ledger
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan
from airflow_eos.spark.layout import Layout
from airflow_eos.spark.stage_settings import StageSettings
from airflow_eos.spark.stager import TaskStager
from airflow_eos.staging.encoding import CopyFormat, column_types, encoder_for
from airflow_eos.targets.postgres.target import PostgresTarget

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
WINDOW = Window("binary_test", T0, T0 + timedelta(hours=1))
LINEAGE = ("eos_topic", "eos_partition", "eos_offset")

HOSTILE_DDL = """
    CREATE TABLE hostile (
        id               bigint        NOT NULL,
        small            integer,
        amount           numeric(12,2) NOT NULL,
        code             varchar(4),
        note             text,
        doc              jsonb,
        at               timestamptz,
        naive            timestamp,
        ratio            float8,
        eos_topic        text          NOT NULL,
        eos_partition    integer       NOT NULL,
        eos_offset       bigint        NOT NULL,
        eos_pipeline     text          NOT NULL,
        eos_window_start timestamptz   NOT NULL
    )
"""
STAGED = ("id", "small", "amount", "code", "note", "doc", "at", "naive", "ratio", *LINEAGE)


def execute(url, statement, params=None):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def begin(url, n):
    plan = WindowPlan(WINDOW, (PartitionRange("t", 0, 0, n),))
    execute(url, HOSTILE_DDL)
    ledger = Ledger(url)
    with ledger.connect() as conn, conn.transaction():
        ledger.lock_pipeline(conn, plan.pipeline)
        ledger.freeze(conn, plan, [])
    target = PostgresTarget(url, "hostile").sink()
    return plan, target, target.begin(plan.window)


def staged(url, attempt, columns="eos_topic, eos_partition, eos_offset", dead=False):
    table = attempt.staging + ("_dl" if dead else "")
    return execute(url, sql.SQL("SELECT {} FROM {}").format(sql.SQL(columns), sql.Identifier("eos_staging", table)))


def assert_exact(rows, expected):
    assert len(rows) == len(set(rows)), f"{len(rows) - len(set(rows))} duplicate rows"
    assert set(rows) == set(expected), (sorted(set(expected) - set(rows))[:5], sorted(set(rows) - set(expected))[:5])


PARIS = "Europe/Paris"


def hostile_batch(offsets, *, bad=frozenset(), amount_type=pa.decimal128(14, 3)):
    """Rows of hostile but valid values; offsets in ``bad`` get the value the
    server must refuse for the column their offset selects (o % 4: NUL in text,
    numeric overflow, invalid JSON, a varchar too long)."""
    def pick(o, good, kind, refused):
        return refused if o in bad and o % 4 == kind else good

    texts = ["", "ünï 🐍", 'q"uo,te\nnew line\r\n', "\\N", "tab\there", "\\x00 is not NUL", "ℝ" * 300]
    return pa.record_batch({
        "id": pa.array(offsets, pa.int64()),
        "small": pa.array([None if o % 7 == 0 else -o for o in offsets], pa.int32()),
        "amount": pa.array([pick(o, Decimal(o) / 8 - 50, 1, Decimal("12345678901.234")) for o in offsets],
                           amount_type),
        "code": [pick(o, None if o % 5 == 0 else f"c{o % 100}", 3, "TOOLONG") for o in offsets],
        "note": [pick(o, None if o % 6 == 0 else texts[o % len(texts)] + str(o), 0, f"nul\x00{o}") for o in offsets],
        "doc": [pick(o, None if o % 9 == 0 else json.dumps({"o": o, "s": "ü\"\n", "n": [1.5, None]}), 2, "{not json")
                for o in offsets],
        "at": pa.array([None if o % 11 == 0 else T0 + timedelta(microseconds=o * 1_000_003) for o in offsets],
                       pa.timestamp("us", tz=PARIS)),
        "naive": pa.array([datetime(1999, 12, 31, 23, 59, 59, 999_999) + timedelta(seconds=o) for o in offsets],
                          pa.timestamp("ms")),
        "ratio": pa.array([[float("nan"), float("inf"), float("-inf"), None, 1e-300, -0.0][o % 6] for o in offsets],
                          pa.float64()),
        "eos_topic": ["t"] * len(offsets),
        "eos_partition": pa.array([0] * len(offsets), pa.int32()),
        "eos_offset": pa.array(offsets, pa.int64()),
    })


def expected_values(batch):
    """What PostgreSQL must hold for each row: the Python values, amounts
    rounded to the column's scale as PostgreSQL rounds, timestamps as instants in UTC (naive ones as
    their UTC wall clock)."""
    rows = {}
    for r in batch.to_pylist():
        r["amount"] = r["amount"].quantize(Decimal("0.01"), ROUND_HALF_UP)  # PostgreSQL: ties away from 0
        r["doc"] = None if r["doc"] is None else json.loads(r["doc"])
        r["at"] = None if r["at"] is None else r["at"].astimezone(timezone.utc)
        rows[r["id"]] = r
    return rows


def stage(target, attempt, plan, batches, **settings):
    layout = Layout(tuple(target.writer(attempt).columns), None, LINEAGE, None)
    return TaskStager(StageSettings(target, attempt, plan, "run1", layout, **settings), iter(batches)).run()


def test_the_hostile_values_take_the_binary_path_and_arrive_exactly(pg_url, ledger):
    """Every column type of the table has an exact binary form: the chunk is a
    binary COPY, and each value reads back as sent (unicode, quotes, CR/LF,
    backslashes, empty vs null, 300-character values, JSON with escapes,
    NaN/±inf/-0.0, zoned and naive timestamps of other units, int32 into
    bigint, decimals of another scale rounded by the column's typmod)."""
    n = 400
    plan, target, attempt = begin(pg_url, n)
    batch = hostile_batch(list(range(n)))
    with psycopg.connect(pg_url) as conn:
        types = column_types(conn, sql.Identifier("eos_staging", attempt.staging))
    assert encoder_for(batch.select(list(STAGED)).schema, types).format is CopyFormat.BINARY

    result = stage(target, attempt, plan, [batch.slice(0, 150), batch.slice(150)], max_bad_records=0)

    assert (result.rows, result.dead_letters, result.refused, result.copies, len(result.chunks)) == (n, 0, 0, 1, 1)
    got = {r[0]: r for r in staged(pg_url, attempt, "id, small, amount, code, note, doc, at, naive, ratio")}
    want = expected_values(batch)
    assert sorted(got) == list(range(n))
    for i, (_, small, amount, code, note, doc, at, naive, ratio) in got.items():
        w = want[i]
        assert (small, amount, code, note, doc, at, naive) == (
            w["small"], w["amount"], w["code"], w["note"], w["doc"], w["at"], w["naive"]), i
        assert (ratio != ratio and w["ratio"] != w["ratio"]) or (ratio == w["ratio"] and str(ratio) == str(
            w["ratio"])), (i, ratio, w["ratio"])
    assert_exact(staged(pg_url, attempt), {("t", 0, o) for o in range(n)})


@pytest.mark.parametrize("amount_type", [pa.decimal128(14, 3), pa.string()], ids=["binary", "csv"])
def test_every_value_the_server_refuses_becomes_a_dead_letter_nothing_else_lost(pg_url, ledger, amount_type):
    """A write task's 2,000 rows of which 80 hold a value the server refuses, in
    four columns: a NUL byte in text, a numeric beyond numeric(12,2), invalid
    JSON for jsonb, a varchar(4) too long. In binary (decimal amounts) and in
    CSV (amounts as text: no exact binary form, the server parses them) alike:
    exactly the refused rows are dead letters, each naming its column and
    value; every other row is staged once. In binary the NUL is refused on its
    column too, so each refused column costs one server check and one more
    COPY, not a COPY per row: one chunk, 5 COPYs."""
    n = 2_000
    bad = {o for o in range(n) if o % 25 == 7}  # 80 rows, 20 per column (7 % 4 = 3, 32 % 4 = 0, ...)
    plan, target, attempt = begin(pg_url, n)
    batch = hostile_batch(list(range(n)), bad=bad)
    if pa.types.is_string(amount_type):
        batch = batch.set_column(2, "amount", batch.column("amount").cast(pa.string()))

    result = stage(target, attempt, plan, [batch.slice(i, 500) for i in range(0, n, 500)], max_bad_records=80)

    assert (result.rows, result.dead_letters, result.refused) == (n - 80, 80, 80)
    binary = not pa.types.is_string(amount_type)
    if binary:  # in CSV a NUL is refused before the row is split: no column named, isolated row by row
        assert (len(result.chunks), result.column_checks, result.copies) == (1, 4, 5)
    assert_exact(staged(pg_url, attempt), {("t", 0, o) for o in range(n)} - {("t", 0, o) for o in bad})
    dead = {o: e for _, _, o, e in staged(pg_url, attempt, 'topic, partition, "offset", error', dead=True)}
    assert sorted(dead) == sorted(bad)
    for o, error in dead.items():
        assert error == {
            0: 'hostile refused the row: invalid byte sequence for encoding "UTF8": 0x00'
               + (f' (column note: "nul\\x00{o}")' if binary else ""),
            1: 'hostile refused the row: numeric field overflow (column amount: "12345678901.234")',
            2: 'hostile refused the row: invalid input syntax for type json (column doc: "{not json")',
            3: 'hostile refused the row: value too long for type character varying(4) (column code: "TOOLONG")',
        }[o % 4], error
