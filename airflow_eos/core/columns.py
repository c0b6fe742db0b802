"""The columns airflow-eos gives a meaning to in a target's rows, whatever the
target: defined here once, for the transform's output, every target's
published rows and ``verify``'s audit.

- the lineage: the Kafka record a row came from. A record-level pipeline's
  transform keeps them; ``verify`` proves exactly-once through them, and a
  row the target refuses is dead-lettered by them.
- the window: the pipeline and the window a published row belongs to, filled
  by the target at commit (never written by the job).
- a dead letter's: its source record, the error, and the raw record (key and
  value), in that order (core.sink.DEAD_LETTER_SCHEMA gives their types).
"""

from __future__ import annotations

LINEAGE_COLUMNS = ("eos_topic", "eos_partition", "eos_offset")
WINDOW_COLUMNS = ("eos_pipeline", "eos_window_start")
DEAD_LETTER_COLUMNS = ("topic", "partition", "offset", "error", "key", "value")

__all__ = ["DEAD_LETTER_COLUMNS", "LINEAGE_COLUMNS", "WINDOW_COLUMNS"]
