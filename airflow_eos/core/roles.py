"""The roles a sink plays, one small interface each, in the spirit of Flink's
``sink2`` (``SinkWriter``, ``CommittingSinkWriter``, ``Committer``): the
contract of each is in its docstring, and every method that generic code
(the steps, the Spark job, verify, the sweep) calls on a sink is declared on
one of them. :class:`~airflow_eos.core.sink.Sink` is all of them together but
:class:`RefusingWriter` (and its :class:`RowRefusal`), the role of the staging
writer a sink gives the write tasks; the committer role, whose hooks the
commit protocol calls, is :class:`airflow_eos.core.commit.Committer`.

In the order of a window's life::

    TargetIdentity   target_id, claim_identity     which target a pipeline's claim names
    Stager           begin                         stage: a new attempt (fencing older ones) and its staging
    TaskWriting      writer, staging_writer        the stage job's write tasks (rows through Arrow)
    RefusingWriter   refusal, refused_values       a write task's writer, when its target refuses rows
    SparkWriting     spark_output, staged_chunks   the stage job's own Parquet writer (files)
    Checkpointer     checkpoint, seal              the job commit: what the attempt consumed and staged
    Preparer         prepare, count_staged         await_checkpoint: the barrier
    Committer        commit, abort                 core/commit.py: the protocol and its hooks
    Sweeper          sweep, abort_window           the teardown and the sweep of zombies
    Audited          published_relation            what verify reads
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol

from airflow_eos.core import attempt as attempts
from airflow_eos.core.attempt import Attempt, Checkpoint, ConsumedRange, Readiness, StagedChunk
from airflow_eos.core.commit import Committer
from airflow_eos.core.faults import fault_point
from airflow_eos.core.ledger import Ledger
from airflow_eos.core.windows import Window

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SparkOutput:
    """Where the stage job writes an attempt's rows with Spark's own writer
    (JVM side: no Python hop per row), for a sink that takes files (see
    :meth:`SparkWriting.spark_output`)."""

    data: str  # a directory URL: the rows, as Parquet (df.write.mode("append").parquet)
    dead_letters: str  # a directory URL: the dead letters, as Parquet with DEAD_LETTER_SCHEMA
    reserved: tuple[str, ...] = ()  # columns the target gives readers itself: dropped from the rows
    # Hadoop settings of the writes (an object store's endpoint and credentials, from the target's connection):
    # the writer's options, which Spark puts into the write job's Hadoop configuration and redacts from plans
    # (spark.redaction.regex: secret, password, token, access key)
    hadoop: Mapping[str, str] = field(default_factory=dict, hash=False, repr=False)


@dataclass(frozen=True)
class ForeignRecord:
    """A row or record of a target that its readers see and that verify cannot
    attribute to the audited pipeline's committed windows (see
    :meth:`Audited.unattributed`): ``where`` it is in the target (``topic out
    partition 2 offset 17``), ``why`` it is foreign (who wrote it, where the
    lineage says so), and its source record where the lineage names one."""

    where: str
    why: str
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    rows: int | None = 1  # the target's rows it stands for (a file's row count; None: unreadable)


class TargetIdentity(ABC):
    """Which target this is, for the claims of the pipelines publishing into
    it (core/ownership.py) and for the sweep, which takes only its own."""

    @property
    def target_id(self) -> str:
        """The target's identity in the ledger: the string the plans of its
        pipelines claim them with (``eos.pipelines.target``, see
        core/ownership.py), equal to the ``target_id`` of the spec that built
        the sink (``PostgresTarget.target_id``: ``postgresql:schema.table``;
        ``FileTarget.target_id``: ``files:/root``). One ledger database serves
        many targets: :meth:`sweep` aborts only attempts of the pipelines
        claimed for this id (and those :meth:`sweeps_unclaimed` accepts). A
        sink that does not name it cannot sweep."""
        raise NotImplementedError(f"{type(self).__name__} names no target_id: its sweep cannot tell its pipelines "
                                  "from other targets'")

    @property
    def target_aliases(self) -> tuple[str, ...]:
        """Other ids this target may be claimed under (see
        ``TargetSpec.target_aliases``): its sweep takes their pipelines too."""
        return ()

    def claim_identity(self) -> str:
        """The physical thing this sink publishes into, as a pipeline's claim
        records it beside :attr:`target_id` (``eos.pipelines.target_place``):
        two pipelines whose targets resolve to one identity share a target
        (core/ownership.py), whichever connection ids their specs name. Resolved
        at run time (the plan), where the connections are; may ask the target
        (a Kafka target asks its cluster for its id). By default
        :attr:`target_id`, for targets whose id already names the thing."""
        return self.target_id


class Stager(ABC):
    """The stage step's side of a sink (Flink's ``Sink.createWriter``): open
    a new attempt of a planned window, with its empty staging.

    Contract: :meth:`begin` makes the new attempt the window's only
    committable one (its epoch fences every older attempt) in the ledger
    transaction that opens it; a target that cannot take the window's rows
    fails here, before any Spark work, leaving no attempt behind."""

    ledger: Ledger

    @abstractmethod
    def begin(self, window: Window) -> Attempt:
        """Open a new attempt of a planned window (a new epoch, fencing older
        attempts) and create its empty staging."""


class TaskWriting(ABC):
    """The stage job's write tasks (Flink's ``SinkWriter``): rows arrive as
    Arrow batches in Spark tasks and are staged chunk by chunk; each write
    returns a :class:`~airflow_eos.core.checkpoint.StagedChunk` for the job
    commit. A chunk that never reaches the job commit is never published.

    Contract: the writer is picklable (Spark ships it to its tasks); a write
    task rebuilds the sink from :meth:`to_dict` and takes
    :meth:`staging_writer` without asking the database."""

    @abstractmethod
    def writer(self, attempt: Attempt):
        """A picklable object that Spark tasks use to stage rows; each of its
        writes returns a StagedChunk for the job commit."""

    def staging_writer(self, attempt: Attempt, columns: Sequence[str]) -> Any:
        """The writer of ``columns`` of the attempt's staging, without asking
        the database (the stage job's write tasks know the columns); what
        :meth:`writer` returns, for a sink staged through the stage job's
        ``eos_staging`` data source (spark/stage_settings.py)."""
        raise NotImplementedError(f"{type(self).__name__} is not staged through write tasks: it implements no "
                                  "TaskWriting.staging_writer")

    def to_dict(self) -> dict[str, Any]:
        """The bound spec this sink was built from, as
        :meth:`~airflow_eos.core.target.TargetSpec.to_dict` gives it: how the
        stage job's write tasks build the sink again."""
        raise NotImplementedError(f"{type(self).__name__} has no spec to ship to the stage job's write tasks")

    @property
    def label(self) -> str:
        """The target as a person names it in a message (a table, a topic)."""
        raise NotImplementedError(f"{type(self).__name__} names no label")

    def not_null_columns(self, columns: Sequence[str]) -> list[str]:
        """Those of ``columns`` the target refuses a null in: the stage job
        makes a row with a null there a dead letter. None by default."""
        return []


class RowRefusal(Protocol):
    """The target refused one row of a chunk the writer was sending."""

    message: str  # the target's words, with where it says (for the dead letter's error)
    column: str | None  # the staged column whose value it refused, when it names one

    def row(self, table: "pa.Table") -> int | None:
        """The refused row's index in ``table`` (the staged columns of what the
        refused write sent, or of more rows that begin with it); None if it
        cannot be told."""


class RefusingWriter(Protocol):
    """What the stage job asks the staging writer (:meth:`TaskWriting.staging_writer`)
    whose write failed: the job's write tasks (:mod:`airflow_eos.spark.stager`)
    turn a row the target refuses into a dead letter, or into a clear error
    when the target refuses a whole column, without knowing which target it
    is; the writer alone can read its own target's refusals (a PostgreSQL
    COPY's SQLSTATE, line and column, say). A writer that never refuses a
    single row need not implement this."""

    def refusal(self, error: Exception) -> RowRefusal | None:
        """The row the target refused, if ``error`` (raised by the writer's
        ``write``) is a refusal of one of its values; None for any other
        failure, which the job lets fail the task."""

    def refused_values(self, column: str,
                       values: "pa.Array | pa.ChunkedArray") -> tuple[str, list[tuple[int, str, str]]]:
        """Which of ``values`` (one staged column) the target's type of that
        column cannot take, asked at once: the type's name and, for each
        refused value in row order, its row, its text and the target's error."""


class SparkWriting:
    """A sink the stage job fills with Spark's own Parquet writer (a target
    that takes files), instead of write tasks: where to write, clearing an
    earlier run's output, and the chunks left there for the checkpoint."""

    def spark_output(self, attempt: Attempt) -> SparkOutput | None:
        """Where the stage job writes the attempt's rows with Spark's own writer
        (JVM side, no Python hop per row), or None (the default): the job hands
        Arrow batches to :meth:`writer` in its write tasks.

        A sink that names an output has the job, for each run of the attempt:
        call :meth:`clear_writes`; write the good rows (lineage columns kept,
        ``reserved`` ones dropped) with ``write.mode("append").parquet(data)``
        and the dead letters into ``dead_letters``; then call
        :meth:`checkpoint` with what the read tasks consumed and
        :meth:`staged_chunks`."""
        return None

    def clear_writes(self, attempt: Attempt) -> int:
        """Delete what earlier runs of the stage job left in the attempt's
        :meth:`spark_output` (a sink that names one implements it)."""
        raise NotImplementedError(f"{type(self).__name__} names no spark_output")

    def staged_chunks(self, attempt: Attempt) -> list[StagedChunk]:
        """The chunks the Spark job's own writer left in :meth:`spark_output`,
        for the checkpoint (a sink that names one implements it)."""
        raise NotImplementedError(f"{type(self).__name__} names no spark_output")


class Checkpointer(ABC):
    """The job commit (Flink's ``CommittingSinkWriter.prepareCommit``): record
    what the attempt consumed and staged, and make its staging ready to
    publish, in one ledger transaction that a fenced attempt cannot pass."""

    ledger: Ledger

    def checkpoint(self, attempt: Attempt, consumed: Iterable[ConsumedRange],
                   chunks: Iterable[StagedChunk]) -> Checkpoint:
        """Record what the job consumed and staged (called on Spark's job commit
        with the chunks of the successful tasks)."""
        fault_point("stage.before_checkpoint")
        checkpoint = attempts.make_checkpoint(consumed, chunks)
        with self.ledger.connect() as conn, conn.transaction():
            attempts.write_checkpoint(conn, attempt, checkpoint)
            self.seal(conn, attempt, checkpoint)
        return checkpoint

    def seal(self, conn, attempt: Attempt, checkpoint: Checkpoint) -> None:
        """Make the staging ready to publish, in the checkpoint's transaction
        (so a seal that fails leaves no checkpoint, and the stage fails): work
        that would otherwise weigh on the commit. Nothing by default."""


class Preparer(ABC):
    """The barrier (await_checkpoint): the attempt is prepared once its
    checkpoint covers the plan and its staging holds exactly what the
    checkpoint counted (core/attempt/prepare.py)."""

    ledger: Ledger

    def prepare(self, attempt: Attempt) -> Readiness:
        """The barrier: see :func:`airflow_eos.core.attempt.prepare`."""
        return attempts.prepare(self.ledger, attempt, self.staging_problems)

    def staging_problems(self, attempt: Attempt, checkpoint: Checkpoint) -> list[str]:
        """Where the staging differs from ``checkpoint`` (prepare's check): by
        default it is counted chunk by chunk. A sink whose seal verified the
        staging against the checkpoint, and whose writers cannot add to it
        afterwards, may check less."""
        return attempts.chunk_problems(checkpoint.chunks, self.count_staged(attempt), attempt.staging)

    @abstractmethod
    def count_staged(self, attempt: Attempt) -> Mapping[int, tuple[int, int]] | None:
        """chunk -> (rows, dead letters) present in the staging; None if it is gone."""


class Sweeper(TargetIdentity, Committer, ABC):
    """The teardown of a failed run and the sweep of zombies: abort the
    attempts nobody will commit, through the committer's abort, and finish
    what was decided and not yet published."""

    def abort_window(self, window: Window, reason: str) -> list[Attempt]:
        """Abort every live attempt of a window (the abort task of a failed run)."""
        with self.ledger.connect() as conn, conn.transaction():
            live = attempts.live_attempts(conn, window=window)
        return [a for a in live if self.abort(a, reason)]

    def sweeps_unclaimed(self, attempt: Attempt) -> bool:
        """May :meth:`sweep` abort ``attempt``, a stale attempt of a pipeline
        claimed for no target (no claim: planned by a version before claims,
        or released; or a claim without a target: a plan that named none)?
        Such an attempt may be any target's, and aborting another target's
        attempt loses track of its staging (its teardown finds nothing live to
        drop), so a sink says yes only when it knows the attempt is its own,
        or (PostgreSQL, as before targets were told apart) when it is the
        target such pipelines are taken to publish into. False by default:
        they are left to their own target's sweep."""
        return False

    def stale_attempts(self, older_than: timedelta, *, now: datetime | None = None) -> list[Attempt]:
        """What :meth:`sweep` would abort now: this target's live attempts
        opened longer than ``older_than`` ago, oldest first, those of the
        pipelines claimed for :attr:`target_id` and those of pipelines claimed
        for no target that :meth:`sweeps_unclaimed` accepts."""
        cutoff = (now or datetime.now(timezone.utc)) - older_than
        targets = {self.target_id, *self.target_aliases}
        with self.ledger.connect() as conn, conn.transaction():
            stale = attempts.stale_attempts(conn, cutoff, claims=self.ledger.records_claims(conn))
        return [a for a, claimed in stale if claimed in targets or (claimed is None and self.sweeps_unclaimed(a))]

    def pending_publications(self) -> list[Attempt]:
        """The committed attempts of windows whose commit was decided but not
        completed, which :meth:`sweep` finishes (a file target: decided, not
        yet renamed into place), oldest first. None by default: a target whose
        decision and publication are one transaction has none."""
        return []

    def sweep_finishes(self, attempt: Attempt) -> bool:
        """Would :meth:`sweep` record ``attempt`` (one of
        :meth:`stale_attempts`) as committed rather than abort it? A target
        whose commit is decided outside the ledger (a Kafka transaction) says
        so, from what it can read without changing anything; False by
        default. For a dry run: :func:`airflow_eos.core.sweep.sweep_report`."""
        return False

    def sweep(self, older_than: timedelta, *, now: datetime | None = None) -> list[Attempt]:
        """Abort this target's attempts left live longer than ``older_than``
        (zombies nobody aborted; see :meth:`stale_attempts`). Attempts of
        pipelines claimed for another target are left to that target's sweep:
        this sink could not drop their staging. The timeout must exceed the
        longest stage-to-commit time of a healthy run. Returns what was
        aborted; an attempt that cannot be aborted now (its staging locked by
        a writer) is logged and left for next time."""
        mine = self.stale_attempts(older_than, now=now)
        swept = []
        for a in mine:
            try:
                if self.abort(a, f"swept: live for longer than {older_than}"):
                    swept.append(a)
            except Exception as exc:  # noqa: BLE001 - one stuck attempt must not stop the sweep
                log.warning("sweep could not abort %s now: %s", a, exc)
        log.info("sweep of %s aborted %d of its %d attempts live for longer than %s", self.target_id, len(swept),
                 len(mine), older_than)
        return swept


class Audited:
    """What ``airflow-eos verify`` reads of a target: the rows published for
    a pipeline, and everything else its readers see."""

    def published_relation(self, conn, pipeline: str, columns: tuple[str, ...] = ()):
        """What ``verify`` audits: a relation (a psycopg ``sql.Composable``
        naming a table, or a parenthesized query) readable in ``conn``, a
        connection to the ledger's database inside the audit's repeatable-read
        transaction, holding every row this target published for ``pipeline``,
        with the columns

        - ``eos_pipeline``, ``eos_window_start``: the row's window (required:
          raise TargetError, saying why, if the target does not keep them);
        - ``eos_topic``, ``eos_partition``, ``eos_offset``: the row's source
          record, all three where the target keeps lineage, else none (verify
          then audits counts per window only);
        - those of ``columns`` (e.g. verify's count column) that it has.

        Rows of other pipelines may be there too (verify selects its
        pipeline's). Composed into verify's queries, it must read the target as
        of the connection's snapshot, so that a commit running meanwhile is seen
        wholly or not at all: a target in the ledger's database names its table;
        a file target loads its published files into a temp table (ON COMMIT
        DROP) and names it; a Kafka target likewise loads its published records.
        Not implemented by default: such a target cannot be verified.
        """
        raise NotImplementedError(f"verify cannot read what {self!r} published: {type(self).__name__} does not "
                                  "implement Sink.published_relation")

    def unattributed(self, conn, pipeline: str, topics: Sequence[str]) -> Iterator[ForeignRecord]:
        """What ``verify`` reads beyond :meth:`published_relation`: the WHOLE
        target as its readers see it (a Kafka topic read with
        ``isolation.level=read_committed``), yielding every row or record there
        that cannot be attributed to ``pipeline``'s committed windows and that
        concerns it: one written by no airflow-eos pipeline (a foreign writer),
        one another pipeline published from one of ``topics`` (this pipeline's
        source topics: the same records twice). Rows of other pipelines with
        other topics are theirs, not foreign. ``conn`` is verify's connection
        to the ledger's database (its snapshot). Each is a violation.

        By default nothing: for a target whose readers see no more than
        :meth:`published_relation` holds (it gives the whole target)."""
        return iter(())
