"""What a staging writer tells the stage job when its target refuses rows.

The stage job's write tasks (:mod:`airflow_eos.spark.stager`) turn a row the
target refuses into a dead letter, or into a clear error when the target
refuses a whole column, without knowing which target it is: they ask the
writer, which alone can read its own target's refusals (a PostgreSQL COPY's
SQLSTATE, line and column, say). A writer that never refuses a single row
need not implement this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pyarrow as pa


class RowRefusal(Protocol):
    """The target refused one row of a chunk the writer was sending."""

    message: str  # the target's words, with where it says (for the dead letter's error)
    column: str | None  # the staged column whose value it refused, when it names one

    def row(self, table: "pa.Table") -> int | None:
        """The refused row's index in ``table`` (the staged columns of what the
        refused write sent, or of more rows that begin with it); None if it
        cannot be told."""


class RefusingWriter(Protocol):
    """The questions the stage job asks a writer whose write failed."""

    def refusal(self, error: Exception) -> RowRefusal | None:
        """The row the target refused, if ``error`` (raised by the writer's
        ``write``) is a refusal of one of its values; None for any other
        failure, which the job lets fail the task."""

    def refused_values(self, column: str,
                       values: "pa.Array | pa.ChunkedArray") -> tuple[str, list[tuple[int, str, str]]]:
        """Which of ``values`` (one staged column) the target's type of that
        column cannot take, asked at once: the type's name and, for each
        refused value in row order, its row, its text and the target's error."""


__all__ = ["RefusingWriter", "RowRefusal"]
