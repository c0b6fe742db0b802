"""What verify reports of the whole target beyond the pipeline's own rows:
the rows or records its readers see that it cannot attribute to the pipeline's
committed windows (Sink.unattributed), as FOREIGN violations."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_eos.core.sink import Sink
from airflow_eos.verify.report import FOREIGN, MORE, Violation


def foreign_violations(sink: Sink, conn, pipeline: str, topics: Sequence[str], label: str,
                       max_examples: int) -> tuple[list[Violation], int]:
    """One violation per foreign record, up to ``max_examples``, then one
    saying how many more there are; and the target's rows they stand for."""
    found: list[Violation] = []
    more = rows = 0
    for record in sink.unattributed(conn, pipeline, sorted(topics)):
        rows += record.rows or 0
        if len(found) < max(1, max_examples):
            found.append(Violation(FOREIGN, f"{label}: {record.where} {record.why}", None, record.topic,
                                   record.partition, record.offset))
        else:
            more += 1
    if more:
        found.append(Violation(MORE, f"{label}: {more} more record(s) of kind {FOREIGN} not listed"))
    return found, rows
