"""What an attempt is: its states, its identity (Attempt, plain data that
travels to Spark and XCom), the name of its staging, and its row read with its
window's (AttemptStatus), with the rule that only the current attempt moves."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from airflow_eos.core.errors import AttemptClosed, AttemptFenced
from airflow_eos.core.ledger import WindowState
from airflow_eos.core.windows import Window, to_utc


class AttemptState(str, Enum):
    """An attempt's state, stored in ``eos.attempts.state`` as its value (a
    member is a str, so psycopg binds it as that text and it equals it)."""

    OPEN = "open"
    CHECKPOINTED = "checkpointed"
    PREPARED = "prepared"
    COMMITTED = "committed"
    ABORTED = "aborted"

    def __str__(self) -> str:  # the value in messages and f-strings, not "AttemptState.OPEN"
        return self.value


OPEN = AttemptState.OPEN
CHECKPOINTED = AttemptState.CHECKPOINTED
PREPARED = AttemptState.PREPARED
COMMITTED = AttemptState.COMMITTED
ABORTED = AttemptState.ABORTED
LIVE = (OPEN, CHECKPOINTED, PREPARED)  # may still be aborted (or swept)
# LIVE as SQL literals: a query with this predicate can use the partial index attempts_open
LIVE_SQL = ", ".join(f"'{s.value}'" for s in LIVE)


@dataclass(frozen=True)
class Attempt:
    """One execution of a window's stage step. Plain data: picklable for Spark,
    ``to_dict`` for XCom."""

    pipeline: str
    window_start: datetime
    window_end: datetime
    epoch: int
    staging: str  # the staging's name in the target's namespace (see staging_name)

    @property
    def window(self) -> Window:
        return Window(self.pipeline, self.window_start, self.window_end)

    def __str__(self) -> str:
        return f"{self.window} attempt {self.epoch}"

    def to_dict(self) -> dict:
        return {"pipeline": self.pipeline, "window_start": self.window_start.isoformat(),
                "window_end": self.window_end.isoformat(), "epoch": self.epoch, "staging": self.staging}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Attempt":
        return cls(data["pipeline"], to_utc(data["window_start"]), to_utc(data["window_end"]),
                   int(data["epoch"]), data["staging"])


def staging_name(pipeline: str, window_start: datetime, epoch: int) -> str:
    """A name for an attempt's staging that is safe in any namespace (lowercase
    letters, digits, underscores; at most 56 characters, leaving room for a
    suffix within PostgreSQL's 63) and readable to a person looking for it.

    The pipeline name reaches it only as a hash plus a sanitised prefix, so a
    hostile pipeline name can never shape SQL or a path.
    """
    digest = hashlib.sha256(f"{pipeline}\0{to_utc(window_start).isoformat()}".encode()).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9]+", "_", pipeline.lower()).strip("_")[:20] or "p"
    return f"{slug}_{to_utc(window_start):%Y%m%d%H%M}_{digest}_e{epoch}"



@dataclass(frozen=True)
class AttemptStatus:
    """An attempt's row and its window's, read together."""

    epoch: int
    state: AttemptState
    reason: str | None
    row_count: int | None
    dead_letter_count: int | None
    window_state: WindowState
    window_epoch: int
    committed_epoch: int | None
    published_rows: int | None
    dead_letter_rows: int | None

    @property
    def fenced(self) -> bool:
        return self.epoch < self.window_epoch



def check_current(attempt: Attempt, status: AttemptStatus, doing: str) -> None:
    """Refuse to move an attempt that is closed or fenced."""
    if status.state in (COMMITTED, ABORTED):
        raise AttemptClosed(f"cannot {doing} {attempt}: it was {status.state}"
                            + (f" ({status.reason})" if status.reason else ""))
    if status.fenced:
        raise AttemptFenced(
            f"cannot {doing} {attempt}: attempt {status.window_epoch} of the window was opened after it, "
            "so it is fenced (a rerun or a zombie); only the newest attempt can be prepared or committed"
        )
