"""The Python writer of an Iceberg attempt's staging, for the stage job's write
tasks (and tests, scripts): each call writes one chunk, a data file and its
dead letters' file of one name. The Spark job's own Parquet writer writes the
same folders without it (``IcebergSink.spark_output``)."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_eos.core.attempt import StagedChunk
from airflow_eos.core.columns import DEAD_LETTER_COLUMNS
from airflow_eos.core.errors import TargetError
from airflow_eos.core.faults import fault_point
from airflow_eos.core.sink import dead_letters_as_rows
from airflow_eos.core.staged_files import one_schema
from airflow_eos.targets.iceberg.files import Store, chunk_id, names_digest

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

ROWS = "rows"
DEAD_LETTERS = "dead_letters"
FOLDERS = {"data": ROWS, "dead_letters": DEAD_LETTERS}  # kind of a staged file -> its folder
# An object store has no directories: an empty object beside the folders marks an attempt's staging as there
# (begin writes it, an abort deletes it with the rest), as its folders do on a file system.
OPEN_MARKER = "_eos_open"


def staging_gone(store: Store, attempt_url: str, local: bool) -> bool:
    """Whether an attempt's staging is gone (its attempt aborted): its
    ``rows/`` folder on a file system, its open marker on an object store."""
    if local:
        return not store.is_dir(f"{attempt_url}/{ROWS}")
    return store.size(f"{attempt_url}/{OPEN_MARKER}") is None


def dead_letter_schema() -> pa.Schema:
    import pyarrow as pa
    return pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                      ("error", pa.string()), ("key", pa.binary()), ("value", pa.binary())])


@dataclass(frozen=True)
class IcebergWriter:
    """Stages rows of one attempt as Parquet files in its folder under the
    table's location. Plain data: pickle it into the tasks."""

    attempt_url: str  # <table location>/data/eos/<attempt.staging>
    target: str  # for messages
    store: Store
    local: bool  # a local directory (or else an object store: its open marker says the staging is there)

    @property
    def data_url(self) -> str:
        return f"{self.attempt_url}/{ROWS}"

    @property
    def dead_letter_url(self) -> str:
        return f"{self.attempt_url}/{DEAD_LETTERS}"

    def write(self, batches: Iterable[pa.RecordBatch | pa.Table],
              dead_letters: Iterable[pa.RecordBatch | pa.Table | Mapping] = ()) -> StagedChunk:
        """Write the batches as one Parquet file and the dead letters as a
        second one of the same name: one chunk (see FileWriter.write of the
        file target for the same contract)."""
        import pyarrow as pa
        started = time.monotonic()
        name = f"part-{secrets.token_hex(8)}.parquet"
        if staging_gone(self.store, self.attempt_url, self.local):
            raise self._gone()
        try:
            rows = self._write_rows(f"{self.data_url}/{name}", batches)
            dead_rows = list(dead_letters_as_rows(dead_letters))
            if dead_rows:
                table = pa.Table.from_pylist([dict(zip(DEAD_LETTER_COLUMNS, r)) for r in dead_rows],
                                             schema=dead_letter_schema())
                self.store.write_parquet(f"{self.dead_letter_url}/{name}", [table], table.schema)
        except FileNotFoundError as exc:
            raise self._gone() from exc
        except OSError as exc:
            raise TargetError(f"cannot stage rows for {self.target} in {self.attempt_url}: {exc}") from exc
        except pa.ArrowException as exc:
            raise TargetError(f"cannot write rows for {self.target} as Parquet: {exc}") from exc
        chunk = StagedChunk(chunk_id(name), rows, len(dead_rows), names_digest([name] * (bool(rows) + bool(dead_rows))))
        log.info("staged chunk %d (%s) into %s: %d rows, %d dead letters in %.2fs", chunk.chunk, name,
                 self.attempt_url, rows, chunk.dead_letters, time.monotonic() - started)
        return chunk

    def _gone(self) -> TargetError:
        return TargetError(f"the staging {self.attempt_url} of {self.target} does not exist: its attempt was aborted "
                           "(a fenced or zombie writer cannot stage any more)")

    def _write_rows(self, url: str, batches: Iterable[pa.RecordBatch | pa.Table]) -> int:
        chunk = one_schema(batches)
        if chunk is None:
            return 0
        schema, tables = chunk
        rows = self.store.write_parquet(url, tables, schema)
        fault_point("stage.mid_write")
        return rows

