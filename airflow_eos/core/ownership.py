"""Who a pipeline belongs to: its claim, and which claims cannot live together.

The first plan of a pipeline claims it in the ledger (``eos.pipelines``): the DAG
that plans it, the topics it reads, the target it publishes into. Every later
plan must agree, because a pipeline id is what ties a record to the one window
that publishes it:

- one DAG per pipeline id. Two DAGs sharing one would plan the same windows
  from different schedules or topics and fail each other's windows;
- the topics are fixed: another topic set under the same id would leave the old
  topics' records without a pipeline, or read records twice;
- the target is fixed: the pipeline's offsets say what was published *there*;
- across pipelines, one target never receives the same topic from two
  pipelines (every record would be published twice, and each pipeline's
  verify, looking at its own rows, would find nothing wrong), and a target
  that holds one pipeline only (a ``partition_per_window`` table: each window
  is one of its partitions) has one pipeline. Pipelines with disjoint topics
  may share a target whose rows carry ``eos_pipeline``.

A plan that names no DAG (the core API) or no target (a hand-built plan
operator) neither conflicts on it nor claims it; the first plan that names it
fills it in. Deliberate moves (a DAG renamed, other topics, another target)
release the claim first (``airflow-eos release``); the next plan claims again.

This module is the rules only; the ledger stores claims and the planner takes
the locks (core/plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass

RELEASE_HINT = "airflow-eos release --pipeline {pipeline} --postgres-url ..."


@dataclass(frozen=True)
class Claim:
    """What a plan says a pipeline belongs to, or what the ledger recorded.

    ``target`` is the target's id as its spec names it (``PostgresTarget.target_id``,
    ``kafka:<conn_id>/<topic>``); ``place`` the physical thing it resolved to
    at run time (``Sink.claim_identity``: ``kafka-cluster:<id>/<topic>``), None
    where unknown (a claim recorded before places were, a plan without its
    target's connections); ``target_exclusive`` says the target holds this one
    pipeline only. Two claims name one target when their ids or their places
    are equal (:meth:`same_target`).
    """

    pipeline: str
    topics: tuple[str, ...]
    dag_id: str | None = None
    target: str | None = None
    target_exclusive: bool = False
    place: str | None = None

    def same_target(self, other: "Claim") -> bool:
        """Both claims publish into one target: one id (the old comparison, which
        recognises every claim recorded before places), or one place (two
        connection ids of one cluster)."""
        return bool((self.target and self.target == other.target)
                    or (self.place and self.place == other.place))

    def describe(self) -> str:
        """``pipeline 'p' (DAG 'd'; topics a, b; target postgresql:s.t)``."""
        return f"pipeline {self.pipeline!r} ({self.owner()})"

    def owner(self) -> str:
        """``DAG 'd'; topics a, b; target postgresql:s.t``."""
        dag = f"DAG {self.dag_id!r}" if self.dag_id else "planned without a DAG"
        parts = [dag, "topics " + ", ".join(self.topics)]
        if self.target:
            parts.append(f"target {self.target}" + (" (one pipeline only)" if self.target_exclusive else ""))
        return "; ".join(parts)

    def covers(self, asked: "Claim") -> bool:
        """This recorded claim already holds everything ``asked`` names: the
        plan may go on without writing to the ledger."""
        return (self.topics == asked.topics
                and (asked.dag_id is None or asked.dag_id == self.dag_id)
                and (asked.target is None or asked.target == self.target)
                and (asked.place is None or asked.place == self.place)
                and (self.target_exclusive or not asked.target_exclusive))

    def filled_from(self, asked: "Claim") -> "Claim":
        """This recorded claim with what it did not know yet taken from ``asked``
        (call after ``own_claim_conflict`` found none). A target once claimed
        for one pipeline only stays so until released: its partitions are that
        pipeline's."""
        return Claim(self.pipeline, self.topics, self.dag_id or asked.dag_id, self.target or asked.target,
                     self.target_exclusive or asked.target_exclusive,
                     # the place resolved now wins: the target id names the same thing it did
                     asked.place or self.place)


def own_claim_conflict(claimed: Claim, asked: Claim) -> str | None:
    """Why a plan may not plan the pipeline claimed as ``claimed``, or None."""
    release = RELEASE_HINT.format(pipeline=claimed.pipeline)
    if asked.dag_id and claimed.dag_id and asked.dag_id != claimed.dag_id:
        return (f"two DAGs share pipeline id {claimed.pipeline!r}: DAG {claimed.dag_id!r} (topics "
                f"{', '.join(claimed.topics)}) claimed it first, and DAG {asked.dag_id!r} (topics "
                f"{', '.join(asked.topics)}) plans it now. Give each DAG its own pipeline id. If DAG "
                f"{claimed.dag_id!r} was renamed to {asked.dag_id!r} on purpose, run `{release}` once.")
    if asked.topics != claimed.topics:
        return (f"{asked.describe()} asks for other topics than its claim: {claimed.describe()}. A pipeline's "
                "topics are fixed by its first plan, so that each record belongs to one pipeline. Give these "
                f"topics their own pipeline id; to change this pipeline's topics on purpose, run `{release}` "
                "(windows planned before keep the topics they were planned with).")
    if asked.target and claimed.target and asked.target != claimed.target:
        return (f"{asked.describe()} publishes into another target than its claim: {claimed.describe()}. The "
                "pipeline's offsets say what was published into its target. Give the new target its own "
                f"pipeline id; to move this pipeline on purpose, run `{release}`.")
    return None


def shared_target_conflict(other: Claim, asked: Claim) -> str | None:
    """Why pipeline ``asked`` may not publish into the target ``other`` (another
    pipeline) claimed first, or None."""
    if other.pipeline == asked.pipeline or not asked.target or not other.same_target(asked):
        return None
    if other.target_exclusive or asked.target_exclusive:
        return (f"target {asked.target} takes the windows of one pipeline only (as a partition_per_window "
                f"table does: each window is one of its partitions), and {other.describe()} claimed it first; "
                f"refused: {asked.describe()}. Give pipeline {asked.pipeline!r} a target of its own.")
    shared = sorted(set(other.topics) & set(asked.topics))
    if shared:
        where = asked.target if other.target == asked.target else (
            f"{asked.place} (named {other.target} by {other.pipeline!r} and {asked.target} by {asked.pipeline!r})")
        return (f"pipelines {other.pipeline!r} and {asked.pipeline!r} would both publish topic(s) "
                f"{', '.join(shared)} into {where}: every record of them would be published twice. "
                f"{other.describe()} claimed it first; refused: {asked.describe()}. Read other topics, publish "
                "into another target, or run them as one pipeline.")
    return None
