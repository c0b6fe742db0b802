"""The fields of :class:`~airflow_eos.targets.files.sink.FileSink`, declared
once for its parts (staging, commit, finish, abort, published), each of which
is a mixin of that frozen dataclass and reads them: the dataclass sets them,
this base says what they are."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_eos.targets.files.storage import Files


class FileSinkFields:
    """What every part of a FileSink may read (set by the dataclass)."""

    root: str  # the target's root directory (resolved)
    ledger_url: str  # the ledger's database
    layout: str  # the partition directory of a window (see layout.py)
    on_committed: str  # "skip" or "replace"
    format: str  # "parquet"
    replaced_retention_s: float  # how long a replaced window's old version is kept
    files: Files  # the file system that holds the root (a property of the sink)
