"""An attempt's checkpoint: what its job consumed and what it staged, and how
that is checked against the plan and the staging.

Staged rows arrive in *chunks*: one chunk is one writer transaction (one Spark
task). The checkpoint, written once on Spark's job commit, lists the chunks of the
successful tasks with their exact counts; rows of any other chunk (a task that
failed after its transaction, a speculative duplicate) are never counted nor
published. One Kafka partition may be read by several Spark tasks: their
sub-ranges are merged into one consumed range per partition.

Plain data and pure checks: storing a checkpoint and proving an attempt
prepared are the attempt's steps (core/attempt/).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from airflow_eos.core.errors import InvalidCheckpoint
from airflow_eos.core.windows import PartitionRange, TopicPartition


@dataclass(frozen=True)
class ConsumedRange:
    """Offsets ``[start_offset, end_offset)`` of one partition that the job read,
    holding ``records`` records (fewer than offsets where the log has gaps)."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    records: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True)
class StagedChunk:
    """What one writer transaction (one Spark task) staged; the writer returns it
    and Spark hands it to the job commit, which checkpoints all of them."""

    chunk: int
    rows: int
    dead_letters: int
    checksum: str


@dataclass(frozen=True)
class Checkpoint:
    ranges: tuple[ConsumedRange, ...]
    chunks: tuple[StagedChunk, ...]

    @property
    def row_count(self) -> int:
        return sum(c.rows for c in self.chunks)

    @property
    def dead_letter_count(self) -> int:
        return sum(c.dead_letters for c in self.chunks)

    @property
    def checksum(self) -> str:
        return combine_checksums(c.checksum for c in self.chunks)


def combine_checksums(checksums: Iterable[str]) -> str:
    """Order-independent: Spark tasks finish in any order. A sum (not XOR), so
    two identical chunks do not cancel out."""
    return f"{sum(int(c, 16) for c in checksums) % (1 << 128):032x}"


def make_checkpoint(consumed: Iterable[ConsumedRange], chunks: Iterable[StagedChunk]) -> Checkpoint:
    """Validate what a job reports and merge the sub-ranges of split partitions
    (one Kafka partition may be read by several Spark tasks) into one range each."""
    by_tp: dict[TopicPartition, list[ConsumedRange]] = {}
    for r in consumed:
        if r.start_offset < 0 or r.end_offset < r.start_offset or not 0 <= r.records <= r.end_offset - r.start_offset:
            raise InvalidCheckpoint(f"{r.tp}: consumed range [{r.start_offset}, {r.end_offset}) "
                                    f"with {r.records} records is impossible")
        by_tp.setdefault(r.tp, []).append(r)
    merged = []
    for tp, parts in sorted(by_tp.items()):
        parts.sort(key=lambda r: r.start_offset)
        for before, after in zip(parts, parts[1:]):
            if after.start_offset != before.end_offset:
                what = "overlap" if after.start_offset < before.end_offset else "leave a gap"
                raise InvalidCheckpoint(
                    f"{tp}: consumed ranges [{before.start_offset}, {before.end_offset}) and "
                    f"[{after.start_offset}, {after.end_offset}) {what}"
                )
        merged.append(ConsumedRange(tp.topic, tp.partition, parts[0].start_offset, parts[-1].end_offset,
                                    sum(p.records for p in parts)))
    chunks = tuple(chunks)
    seen = set()
    for c in chunks:
        if c.chunk in seen:
            raise InvalidCheckpoint(f"chunk {c.chunk} is listed twice")
        if c.rows < 0 or c.dead_letters < 0:
            raise InvalidCheckpoint(f"chunk {c.chunk} has negative counts")
        seen.add(c.chunk)
    return Checkpoint(tuple(merged), tuple(sorted(chunks, key=lambda c: c.chunk)))


def coverage_problems(planned: Sequence[PartitionRange], consumed: Sequence[ConsumedRange]) -> list[str]:
    """What the checkpoint lacks to cover the plan exactly: every planned
    partition read from its start cut to its end cut, nothing else read."""
    problems = []
    got = {r.tp: r for r in consumed}
    for p in planned:
        c = got.pop(p.tp, None)
        if p.width == 0 and (c is None or c.end_offset == c.start_offset == p.start_offset):
            continue
        if c is None:
            problems.append(f"{p.tp}: planned [{p.start_offset}, {p.end_offset}), nothing consumed")
            continue
        if c.start_offset == p.start_offset and c.end_offset == p.end_offset:
            continue
        parts = []
        if c.start_offset > p.start_offset:
            parts.append(f"offsets [{p.start_offset}, {min(c.start_offset, p.end_offset)}) not consumed")
        if c.end_offset < p.end_offset:
            parts.append(f"offsets [{max(c.end_offset, p.start_offset)}, {p.end_offset}) not consumed")
        if c.start_offset < p.start_offset or c.end_offset > p.end_offset:
            parts.append("read outside the plan")
        problems.append(f"{p.tp}: planned [{p.start_offset}, {p.end_offset}), consumed "
                        f"[{c.start_offset}, {c.end_offset}): " + ", ".join(parts))
    for tp, c in sorted(got.items()):
        if c.end_offset > c.start_offset:
            problems.append(f"{tp}: consumed [{c.start_offset}, {c.end_offset}) but the window plans nothing there")
    return problems


def chunk_problems(chunks: Sequence[StagedChunk], staged: Mapping[int, tuple[int, int]] | None,
                   where: str) -> list[str]:
    """Where the staging (``staged``: chunk -> (rows, dead letters) actually
    there, None if the staging is gone) differs from the checkpoint's chunks."""
    if staged is None:
        return [f"the staging {where} is gone (a database crash empties unlogged staging); "
                "stage the window again"]
    problems = []
    for c in chunks:
        rows, dead = staged.get(c.chunk, (0, 0))
        if (rows, dead) != (c.rows, c.dead_letters):
            problems.append(f"chunk {c.chunk}: checkpoint counted {c.rows} rows and {c.dead_letters} dead letters, "
                            f"staging {where} holds {rows} and {dead}")
    return problems
