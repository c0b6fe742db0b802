"""Pure logic of the two-phase-commit sink: names, checkpoints, prepare's
checks, configuration, the writer's encoding."""

from __future__ import annotations

import pickle
import re
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from airflow_eos.core.attempt import (
    Attempt,
    ConsumedRange,
    StagedChunk,
    combine_checksums,
    coverage_problems,
    make_checkpoint,
    staging_name,
    chunk_problems,
)
from airflow_eos.core.errors import ConfigurationError, InvalidCheckpoint
from airflow_eos.targets.postgres.target import PostgresTarget, StagingWriter, _csv, parse_table_name
from airflow_eos.core.windows import PartitionRange

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("text, parsed", [
    ("orders", (None, "orders")),
    ("Analytics.Orders", ("analytics", "orders")),
    (" analytics . orders ", ("analytics", "orders")),
    ('"Analytics"."Orders"', ("Analytics", "Orders")),
    ('"my.schema"."ta""ble; DROP TABLE x"', ("my.schema", 'ta"ble; DROP TABLE x')),
    ('"a".b', ("a", "b")),
    ("orders; drop table x", (None, "orders; drop table x")),
])
def test_table_names_parse_like_sql(text, parsed):
    assert parse_table_name(text) == parsed


@pytest.mark.parametrize("text", ["", "a.", ".a", "a.b.c", '"unterminated', '"a"b', 'a"b"', '""'])
def test_bad_table_names_are_refused(text):
    with pytest.raises(ConfigurationError):
        parse_table_name(text)


@pytest.mark.parametrize("names, target_id", [
    (["analytics.orders", '"analytics".orders', "ANALYTICS.Orders", ' analytics . orders ', 'analytics."orders"'],
     "postgresql:analytics.orders"),
    (["orders", "public.orders", '"public"."orders"'], "postgresql:public.orders"),
    (['"Analytics"."Orders"'], 'postgresql:"Analytics"."Orders"'),
    (['"my.schema"."ta""ble"'], 'postgresql:"my.schema"."ta""ble"'),  # no two tables share an identity
])
def test_a_tables_identity_for_the_pipeline_claim_is_one_however_it_is_spelt(names, target_id):
    assert {PostgresTarget(table=n).target_id for n in names} == {target_id}
    assert {PostgresTarget(table=n, mode="partition_per_window").target_id for n in names} == {target_id}
    assert {PostgresTarget("postgresql://u@h/db", n).sink().target_id for n in names} == {target_id}


@pytest.mark.parametrize("pipeline", ["orders_hourly", "x" * 500, "'; DROP TABLE eos.windows; --\"", "ünï", "."])
def test_staging_names_are_safe_short_and_distinct(pipeline):
    name = staging_name(pipeline, T0, 2_147_483_647)
    assert re.fullmatch(r"[a-z0-9_]+", name) and len(name) + len("_dl") <= 63
    assert name == staging_name(pipeline, T0, 2_147_483_647)
    assert name != staging_name(pipeline, T0, 1)
    assert name != staging_name(pipeline, T0 + timedelta(hours=1), 2_147_483_647)
    assert name != staging_name(pipeline + "2", T0, 2_147_483_647)


def test_attempt_round_trips_through_xcom_and_pickle():
    attempt = Attempt("p", T0, T0 + timedelta(hours=1), 3, staging_name("p", T0, 3))
    assert Attempt.from_dict(attempt.to_dict()) == attempt
    assert pickle.loads(pickle.dumps(attempt)) == attempt
    assert str(attempt) == "p [2024-01-01T00:00:00+00:00, 2024-01-01T01:00:00+00:00) attempt 3"


# --------------------------------------------------------------------------- checkpoint


def test_checkpoint_merges_split_partitions_and_sums_chunks():
    checkpoint = make_checkpoint(
        [ConsumedRange("t", 1, 50, 100, 49), ConsumedRange("t", 0, 0, 10, 10), ConsumedRange("t", 1, 0, 50, 50)],
        [StagedChunk(7, 30, 1, "0f"), StagedChunk(3, 29, 0, "01")],
    )
    assert checkpoint.ranges == (ConsumedRange("t", 0, 0, 10, 10), ConsumedRange("t", 1, 0, 100, 99))
    assert [c.chunk for c in checkpoint.chunks] == [3, 7]
    assert (checkpoint.row_count, checkpoint.dead_letter_count) == (59, 1)
    assert checkpoint.checksum == combine_checksums(["01", "0f"]) == f"{0x10:032x}"


@pytest.mark.parametrize("consumed, chunks, message", [
    ([ConsumedRange("t", 0, 0, 10, 10), ConsumedRange("t", 0, 9, 20, 11)], [], "overlap"),
    ([ConsumedRange("t", 0, 0, 10, 10), ConsumedRange("t", 0, 11, 20, 9)], [], "leave a gap"),
    ([ConsumedRange("t", 0, 0, 10, 11)], [], "impossible"),
    ([ConsumedRange("t", 0, 10, 5, 0)], [], "impossible"),
    ([], [StagedChunk(1, 1, 0, "0"), StagedChunk(1, 1, 0, "0")], "listed twice"),
])
def test_impossible_checkpoints_are_refused(consumed, chunks, message):
    with pytest.raises(InvalidCheckpoint, match=message):
        make_checkpoint(consumed, chunks)


def test_checksums_combine_in_any_order_and_duplicates_do_not_cancel():
    digests = ["ab" * 16, "cd" * 16, "ef" * 16]
    assert combine_checksums(digests) == combine_checksums(reversed(digests))
    assert combine_checksums(digests[:1] * 2) != combine_checksums([])


# --------------------------------------------------------------------------- prepare's checks


PLAN = [PartitionRange("t", 0, 0, 10), PartitionRange("t", 1, 5, 5), PartitionRange("t", 2, 20, 30)]


def test_exact_coverage_has_no_problems():
    consumed = [ConsumedRange("t", 0, 0, 10, 9), ConsumedRange("t", 2, 20, 30, 10)]
    assert coverage_problems(PLAN, consumed) == []
    assert coverage_problems(PLAN, consumed + [ConsumedRange("t", 1, 5, 5, 0)]) == []


def test_coverage_problems_say_exactly_what_is_missing():
    consumed = [ConsumedRange("t", 0, 2, 8, 6), ConsumedRange("t", 3, 0, 4, 4), ConsumedRange("t", 1, 5, 6, 1)]
    assert coverage_problems(PLAN, consumed) == [
        "t[0]: planned [0, 10), consumed [2, 8): offsets [0, 2) not consumed, offsets [8, 10) not consumed",
        "t[1]: planned [5, 5), consumed [5, 6): read outside the plan",
        "t[2]: planned [20, 30), nothing consumed",
        "t[3]: consumed [0, 4) but the window plans nothing there",
    ]
    assert coverage_problems(PLAN, [ConsumedRange("t", 0, 0, 12, 12), ConsumedRange("t", 2, 20, 30, 10)]) == [
        "t[0]: planned [0, 10), consumed [0, 12): read outside the plan"]


def test_chunk_problems_compare_every_checkpointed_chunk():
    chunks = [StagedChunk(1, 10, 0, "0"), StagedChunk(2, 5, 2, "0")]
    assert chunk_problems(chunks, {1: (10, 0), 2: (5, 2), 99: (7, 0)}, "s") == []  # 99: an unlisted chunk
    assert chunk_problems(chunks, {1: (10, 0), 2: (5, 1)}, "s") == [
        "chunk 2: checkpoint counted 5 rows and 2 dead letters, staging s holds 5 and 1"]
    assert chunk_problems(chunks, {}, "s") == [
        "chunk 1: checkpoint counted 10 rows and 0 dead letters, staging s holds 0 and 0",
        "chunk 2: checkpoint counted 5 rows and 2 dead letters, staging s holds 0 and 0"]
    assert "is gone" in chunk_problems(chunks, None, "s")[0]


# --------------------------------------------------------------------------- configuration and writer


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "merge"}, "mode must be one of"),
    ({"on_committed": "overwrite"}, "on_committed must be one of"),
    ({"mode": "upsert"}, "needs key columns"),
    ({"key": ("id",)}, "only used in mode 'upsert'"),
    ({"mode": "partition_per_window", "key": ("id",)}, "only used in mode 'upsert'"),
    ({"columns": ("id", "eos_window_start")}, "filled by the sink"),
    ({"table": "a.b.c"}, "3 parts"),
])
def test_target_configuration_is_checked_at_construction(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        PostgresTarget(**{"url": "postgresql://u:secret@h/db", "table": "t", **kwargs})


def test_target_and_writer_are_picklable_and_never_show_passwords():
    target = PostgresTarget("postgresql://u:secret@h/db", "analytics.orders", mode="upsert", key="id")
    assert target.key == ("id",)
    assert pickle.loads(pickle.dumps(target)) == target
    sink = target.sink()
    assert pickle.loads(pickle.dumps(sink)) == sink and sink.to_dict() == target.to_dict()
    writer = StagingWriter("postgresql://u:secret@h/db", "s_e1", ("id", "note"), "analytics.orders")
    assert StagingWriter.from_json(writer.to_json()) == writer == pickle.loads(pickle.dumps(writer))
    assert "secret" not in repr(target) and "secret" not in repr(sink) and "secret" not in repr(writer)


def test_a_writer_given_a_url_for_another_database_says_so_not_that_its_rows_cannot_be_encoded():
    writer = StagingWriter("mysql://u:secret@h/db", "s_e1", ("id",), "analytics.orders")
    with pytest.raises(ConfigurationError, match="is not a PostgreSQL URL") as raised:
        writer.write([pa.table({"id": [1]})])
    assert "secret" not in str(raised.value)


def test_csv_encoding_keeps_nulls_apart_from_empty_strings_and_instants_in_utc():
    batch = pa.record_batch({
        "s": pa.array(["", None, 'a"b']),
        "b": pa.array([b"\x00\xff", None, b""]),
        "ts": pa.array([datetime(2024, 1, 1, 1, 2, 3, tzinfo=timezone(timedelta(hours=2)))] * 3,
                       pa.timestamp("us", tz="Europe/Berlin")),
        "d": pa.array(["x", "y", "x"]).dictionary_encode(),
    })
    lines = _csv(batch).to_pybytes().decode().splitlines()
    assert lines == [
        '"","\\x00ff",2023-12-31 23:02:03.000000,"x"',
        ',,2023-12-31 23:02:03.000000,"y"',
        '"a""b","\\x",2023-12-31 23:02:03.000000,"x"',
    ]
