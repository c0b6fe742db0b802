"""The columns airflow-eos gives a meaning to in a target's rows, whatever the
target: defined here once, for the transform's output, every target's
published rows and ``verify``'s audit.

- the lineage: the Kafka record a row came from. A record-level pipeline's
  transform keeps them; ``verify`` proves exactly-once through them, and a
  row the target refuses is dead-lettered by them.
- the window: the pipeline and the window a published row belongs to, filled
  by the target at commit (never written by the job).
"""

from __future__ import annotations

LINEAGE_COLUMNS = ("eos_topic", "eos_partition", "eos_offset")
WINDOW_COLUMNS = ("eos_pipeline", "eos_window_start")

__all__ = ["LINEAGE_COLUMNS", "WINDOW_COLUMNS"]
