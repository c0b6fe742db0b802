"""One write task of the stage job: stage its rows into the attempt's staging in
chunks (one transaction of the sink's staging writer each, at most
``rows_per_chunk`` rows), with its dead letters (rows the transform marked, NOT
NULL violations, rows the target refuses). The contract for transforms and dead
letters is in :mod:`airflow_eos.spark.stage`; the data source that runs this in
Spark's Python workers is :mod:`airflow_eos.spark.staging_source`.

When the target refuses a chunk, the task asks the writer which row and column
it refused (the writer reads its own target's refusals: see
:class:`airflow_eos.core.roles.RefusingWriter`). A refusal on a column costs one more question,
which of the chunk's values of that column the target's type cannot take: those
rows are dead-lettered and the rest staged (_refuse_column); a refusal that
names no column is isolated row by row (_isolate_rows). A column refused for
every value is a configuration error (TargetError), not bad records.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import WriterCommitMessage

from airflow_eos.core.attempt import Attempt, StagedChunk
from airflow_eos.core.columns import LINEAGE_COLUMNS
from airflow_eos.core.errors import EosError, TargetError
from airflow_eos.core.roles import RowRefusal
from airflow_eos.spark.kafka_ranges import read_records
from airflow_eos.spark.stage_settings import StageSettings

if TYPE_CHECKING:
    import pyarrow as pa

DEAD_LETTER_SAMPLES = 5
# The target refusing every non-null value of a column in a chunk of at least
# this many is a configuration error (wrong type in the table or the transform),
# not bad records; fewer (a one-record window, say) are dead letters.
COLUMN_REFUSED_MIN_VALUES = 10


class TooManyBadRecords(EosError):
    """More records were dead-lettered than ``max_bad_records`` allows."""


@dataclass(frozen=True)
class StagedTask(WriterCommitMessage):
    """One write task's commit message: its chunks and what they hold."""

    chunks: tuple[StagedChunk, ...]
    rows: int
    dead_letters: int
    refused: int  # rows the target refused, among the dead letters
    samples: tuple[tuple[str, int, int, str], ...]  # first dead letters: topic, partition, offset, error
    wait_s: float  # waiting for input: reading and transforming upstream
    write_s: float  # encoding, COPY, isolating refused rows
    copies: int = 0  # COPY transactions tried (chunks staged, and those the target refused)
    column_checks: int = 0  # refused columns whose values the server checked at once


class TaskStager:
    """Stages one write task's input: good rows in chunks, dead letters with them."""

    def __init__(self, settings: StageSettings, batches: Iterator["pa.RecordBatch"]):
        self.settings = settings
        self.layout = settings.layout
        target, attempt = settings.target, settings.attempt
        # The sink's staging writer for exactly the layout's columns, built
        # here: no round trip per task. When the target refuses rows, it
        # answers the questions of core.roles.RefusingWriter.
        self.writer = target.staging_writer(attempt, self.layout.staged)
        self.input = batches
        self.exhausted = False
        self.pending: list[pa.RecordBatch] = []  # good rows taken from the input, in no committed chunk yet
        self.dead: list[dict] = []  # dead letters in no committed chunk yet
        self.chunks: list[StagedChunk] = []
        self.rows = self.dead_total = self.refused = 0
        self.copies = self.column_checks = 0
        self.samples: list[tuple[str, int, int, str]] = []
        self.wait_s = 0.0

    def run(self) -> StagedTask:
        started = time.perf_counter()
        while True:
            while not self.pending and not self.exhausted:
                self._pull()
            if not self.pending:
                break
            self._write_streaming()
        if self.dead:
            self._write([])  # the last dead letters, in a chunk of their own
        total = time.perf_counter() - started
        return StagedTask(tuple(self.chunks), self.rows, self.dead_total, self.refused, tuple(self.samples),
                          self.wait_s, total - self.wait_s, self.copies, self.column_checks)

    # ---------------------------------------------------------------- input

    def _pull(self) -> bool:
        """Take the next input batch: its good rows into pending, its dead
        letters into dead. False once the input is exhausted."""
        t0 = time.perf_counter()
        batch = next(self.input, None)
        self.wait_s += time.perf_counter() - t0
        if batch is None:
            self.exhausted = True
            return False
        good, dead = self._split(batch)
        if good.num_rows:
            self.pending.append(good)
        if dead:
            self._dead_letters(dead)
        return True

    def _split(self, batch: "pa.RecordBatch") -> tuple["pa.RecordBatch", list[dict]]:
        layout = self.layout
        if layout.error is None:
            return batch.select(list(layout.kept)), []
        errors = batch.column(layout.error)
        if errors.null_count == batch.num_rows:
            return batch.select(list(layout.kept)), []
        import pyarrow.compute as pc

        good_mask = errors.is_null()
        bad = batch.filter(pc.invert(good_mask))
        if layout.lineage is None:
            raise TargetError(f"{bad.num_rows} row(s) for {self.settings.target.label} are dead letters (first: "
                              f"{bad.column(layout.error)[0].as_py()}) but have no lineage columns "
                              f"{list(LINEAGE_COLUMNS)} to name their source records")
        columns = {name: bad.column(name).to_pylist() for name in (*layout.lineage, layout.error)}
        raw = {name: bad.column(name).to_pylist() for name in layout.raw} if layout.raw else {}
        topic, partition, offset = layout.lineage
        dead = [{"topic": columns[topic][i], "partition": columns[partition][i], "offset": columns[offset][i],
                 "error": columns[layout.error][i]} for i in range(bad.num_rows)]
        if raw:  # else _read_back_raw gives them their record's key and value
            for i, d in enumerate(dead):
                d["key"], d["value"] = raw[layout.raw[0]][i], raw[layout.raw[1]][i]
        return batch.filter(good_mask).select(list(layout.kept)), dead

    def _dead_letters(self, dead: list[dict]) -> None:
        for d in dead:
            if any(d[k] is None for k in ("topic", "partition", "offset")):
                raise TargetError(f"a dead letter for {self.settings.target.label} has null lineage "
                                  f"({d['topic']!r}, {d['partition']!r}, {d['offset']!r}); its error: {d['error']}")
        self.dead.extend(dead)
        self.dead_total += len(dead)
        for d in dead[: max(0, DEAD_LETTER_SAMPLES - len(self.samples))]:
            self.samples.append((d["topic"], d["partition"], d["offset"], d["error"]))
        if self.dead_total > self.settings.max_bad_records:
            raise TooManyBadRecords(too_many_message(self.settings.attempt, self.settings.max_bad_records, self.dead_total,
                                                    self.samples, "this write task"))

    # ---------------------------------------------------------------- output

    def _staged(self, data: "pa.RecordBatch | pa.Table"):
        return data if len(self.layout.kept) == len(self.layout.staged) else data.select(list(self.layout.staged))

    def _write(self, data: Iterable["pa.RecordBatch | pa.Table"]) -> None:
        """One chunk: ``data`` and the pending dead letters, in one transaction."""
        self._read_back_raw()
        self.copies += 1
        chunk = self.writer.write((self._staged(d) for d in data), dead_letters=self.dead)
        self.chunks.append(chunk)
        self.rows += chunk.rows
        self.dead.clear()

    def _write_streaming(self) -> None:
        """Stream pending and further input into one chunk, up to the chunk's
        bounds, keeping what was sent until it commits: if the target refuses
        rows, the chunk is staged again without them (_write_isolating)."""
        fed = 0

        def feed() -> Iterator["pa.RecordBatch"]:
            nonlocal fed
            rows = nbytes = 0
            while True:
                if fed == len(self.pending):
                    full = rows >= self.settings.rows_per_chunk or nbytes >= self.settings.chunk_bytes
                    if full or self.exhausted or not self._pull():
                        return
                    continue
                batch = self.pending[fed]
                fed += 1
                rows += batch.num_rows
                nbytes += batch.nbytes
                yield batch

        chunk = feed()
        try:
            self._write(chunk)
        except TargetError as exc:
            refusal = self.writer.refusal(exc)
            if refusal is None:
                raise
            import pyarrow as pa

            # Take the rest of the chunk too: a refused column is judged on the
            # whole chunk (_refuse_column), not on however much of it the COPY
            # had sent when the server answered.
            for _ in chunk:
                pass
            sent, self.pending = self.pending[:fed], self.pending[fed:]
            self._write_isolating(pa.Table.from_batches(sent), refusal)
        else:
            del self.pending[:fed]

    def _try_write(self, table: "pa.Table") -> RowRefusal | None:
        """Stage ``table`` as one chunk: None when it was staged, else why the
        target refused a row of it (any other failure raises)."""
        try:
            self._write([table])
        except TargetError as exc:
            refusal = self.writer.refusal(exc)
            if refusal is None:
                raise
            return refusal
        return None

    def _write_isolating(self, table: "pa.Table", refusal: RowRefusal | None = None) -> None:
        """Stage ``table``; each row the target refuses becomes a dead letter.
        ``refusal``: why a write of exactly ``table`` failed, if one was tried.

        A refusal naming a column costs one question to the server, whatever
        the number of rows refused: which of the table's values of that column
        can its type not take (_refuse_column). Those rows become dead letters
        together and the rest is written again; the next refused column, if
        any, likewise. A refusal naming no column (or a column already checked)
        is isolated row by row (_isolate_rows)."""
        checked: set[str] = set()
        while table.num_rows:
            if refusal is None and (refusal := self._try_write(table)) is None:
                return
            if refusal.column is None or refusal.column in checked:
                self._isolate_rows(table, refusal)
                return
            checked.add(refusal.column)
            table, refusal = self._refuse_column(table, refusal), None

    def _isolate_rows(self, table: "pa.Table", refusal: RowRefusal | None = None) -> None:
        """``_write_isolating`` for a refusal that names no column: the refused
        row is found from the COPY's line number; if that cannot be mapped to a
        row, halving finds it. Rows before it are staged as a chunk, the row
        alone is tried (refused: a dead letter), then the rest. A failed COPY
        per refused row."""
        while table.num_rows:
            if refusal is None and (refusal := self._try_write(table)) is None:
                return
            n = table.num_rows
            if n == 1:
                self._refuse(table, refusal)
                return
            row = refusal.row(self._staged(table))
            if row is None:
                self._isolate_rows(table.slice(0, n // 2))
                table, refusal = table.slice(n // 2), None
                continue
            if row:
                self._isolate_rows(table.slice(0, row))
            self._isolate_rows(table.slice(row, 1))
            table, refusal = table.slice(row + 1), None

    def _refuse(self, row: "pa.Table", refusal: RowRefusal) -> None:
        values = row.to_pylist()[0]
        error = f"{self.settings.target.label} refused the row: {refusal.message}"
        lineage = self.layout.lineage
        if lineage is None or any(values.get(c) is None for c in lineage):
            raise TargetError(f"{error}; the row has no lineage columns {list(LINEAGE_COLUMNS)} to dead-letter "
                              f"it with: {_short(values)}")
        self.refused += 1
        self._dead_letters([{"topic": values[lineage[0]], "partition": values[lineage[1]],
                             "offset": values[lineage[2]], "error": error}])

    def _refuse_column(self, table: "pa.Table", refusal: RowRefusal) -> "pa.Table":
        """Dead-letter the rows of ``table`` whose value of the refused column
        the target's type cannot take, found by one question to the server;
        return the others. If it takes none of the column's values
        (COLUMN_REFUSED_MIN_VALUES or more of them), the table or the transform
        is wrong, not the records: fail with a TargetError that says which
        column and what to do."""
        import numpy as np
        import pyarrow as pa

        column = refusal.column
        # COPY took every row before the one it refused: ask only about the rest.
        first = refusal.row(self._staged(table)) or 0
        values = table.column(column)
        target_type, refused = self.writer.refused_values(column, values.slice(first))
        refused = [(first + row, text, error) for row, text, error in refused]
        self.column_checks += 1
        given = len(values) - values.null_count
        if refused and len(refused) == given >= COLUMN_REFUSED_MIN_VALUES:
            raise TargetError(self._column_refused(column, target_type, given, table.num_rows, refused[0]))
        lineage = self.layout.lineage
        target = self.settings.target.label
        if refused and lineage is None:
            _, text, error = refused[0]
            raise TargetError(f"{target} refused {len(refused)} row(s) (first: {error}, column {column}: "
                              f"{_short_text(text)}); the rows have no lineage columns {list(LINEAGE_COLUMNS)} to "
                              "dead-letter them with")
        if not refused:
            return table
        rows = [row for row, _, _ in refused]
        where = table.select(list(lineage)).take(pa.array(rows, pa.int64())).to_pylist()
        for (_, text, error), source in zip(refused, where, strict=True):
            if any(source[c] is None for c in lineage):
                raise TargetError(f"{target} refused a row ({error}, column {column}: {_short_text(text)}); it has "
                                  f"null lineage {tuple(source.values())} to dead-letter it with")
        self.refused += len(refused)
        self._dead_letters([{"topic": source[lineage[0]], "partition": source[lineage[1]],
                             "offset": source[lineage[2]],
                             "error": f"{target} refused the row: {error} (column {column}: {_short_text(text)})"}
                            for (_, text, error), source in zip(refused, where, strict=True)])
        mask = np.ones(table.num_rows, dtype=bool)
        mask[rows] = False
        return table.filter(pa.array(mask))

    def _column_refused(self, column: str, target_type: str, given: int, rows: int, first: tuple[int, str, str]) -> str:
        _, text, error = first
        layout = self.layout
        given_type = layout.types[layout.staged.index(column)] if layout.types else "?"
        return (f"target table {self.settings.target.label} refuses column {column!r} for every row: it is "
                f"{target_type} there, and the transform's output gives {given_type} values the type cannot take "
                f"(e.g. {_short_text(text)}: {error}); all {given} non-null values of the column in a chunk of "
                f"{rows} rows were refused. That is a configuration error, not bad records: fix the transform "
                f"(make {column} {target_type}) or the table's column, then clear the window's run. Nothing of "
                f"{self.settings.attempt} is checkpointed or published.")

    def _read_back_raw(self) -> None:
        """Give each pending dead letter that lacks its raw record (a row the
        target refused; a transform output without key and value) the key and
        value of its source record, read back from Kafka by its lineage, before
        its chunk is written. Good rows carry nothing for this."""
        lacking = [d for d in self.dead if "key" not in d]
        if not lacking or not self.settings.kafka_config:
            return
        by_partition: dict[tuple[str, int], list[dict]] = {}
        for d in lacking:
            by_partition.setdefault((d["topic"], d["partition"]), []).append(d)
        for (topic, partition), letters in by_partition.items():
            records = read_records(self.settings.kafka_config, topic, partition, [d["offset"] for d in letters])
            for d in letters:
                d["key"], d["value"] = records[d["offset"]]


def _short(value: Any, limit: int = 500) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short_text(text: str, limit: int = 40) -> str:
    """A refused value, quoted and shortened for a message."""
    return '"' + (text if len(text) <= limit else text[: limit - 3] + "...") + '"'


def too_many_message(attempt: Attempt, max_bad_records: int, count: int, samples: Sequence[tuple],
                     where: str) -> str:
    first = "; ".join(f"{t}[{p}] offset {o}: {e}" for t, p, o, e in sorted(samples)[:DEAD_LETTER_SAMPLES])
    return (f"{attempt}: {where} dead-lettered {count} records, more than max_bad_records="
            f"{max_bad_records}; no checkpoint is written and the attempt is aborted. First: {first}")



__all__ = ["COLUMN_REFUSED_MIN_VALUES", "DEAD_LETTER_SAMPLES", "StagedTask", "TaskStager", "TooManyBadRecords",
           "too_many_message"]
