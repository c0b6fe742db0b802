"""The window status page as HTML: one section per pipeline, every value
escaped (pipeline names, DAG ids and topics are user input)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote

from airflow_eos.core.attempt import AttemptState
from airflow_eos.ui.status import UNPUBLISHED_ADVICE, PipelineStatus, WindowStatus

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 16px 24px; color: #1a202c; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 4px; }
p.meta { color: #4a5568; margin: 2px 0 8px; }
table { border-collapse: collapse; margin: 6px 0 10px; }
th, td { border-bottom: 1px solid #e2e8f0; padding: 4px 10px; text-align: left; white-space: nowrap; }
th { background: #f7fafc; font-weight: 600; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
span.s { border-radius: 10px; padding: 1px 9px; font-size: 12px; font-weight: 600; color: #fff; }
span.committed { background: #2f855a; } span.replaced { background: #2b6cb0; } span.failed { background: #c53030; }
span.running { background: #b7791f; } span.unpublished { background: #9b2c2c; } span.planned { background: #718096; }
a { color: #2b6cb0; }
"""


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, datetime):
        return escape(value.strftime("%Y-%m-%d %H:%M"))
    return escape(str(value))


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], label: str) -> str:
    """``rows`` are already-escaped HTML cells."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(rows_cells) + "</tr>" for rows_cells in
                   (list(r) for r in rows))
    return f'<table aria-label="{escape(label)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _num(value: Any) -> str:
    return f'<td class="n">{_cell(value)}</td>'


def _attempts(counts: dict[AttemptState, int]) -> str:
    """``1 committed, 1 aborted``: in the order of an attempt's life."""
    return ", ".join(f"{counts[s]} {s}" for s in AttemptState if s in counts) or "–"


def _status(status: WindowStatus) -> str:
    return f'<td><span class="s {status.value}">{escape(status.label)}</span></td>'


def pipeline_section(status: PipelineStatus) -> str:
    name = escape(status.pipeline)
    counts = ", ".join(f"{n} {s.label}" for s, n in sorted(status.counts.items(), key=lambda kv: kv[0].value)) or "none"
    owner = escape(status.owner) if status.owner else "not claimed yet: its next plan claims it"
    link = (f' · <a target="_top" href="../dags/{escape(quote(status.dag_id, safe=""))}">open the DAG</a>'
            if status.dag_id else "")
    windows = _table(
        ["start (UTC)", "end (UTC)", "status", "epoch", "committed epoch", "attempts", "rows", "dead letters",
         "committed at (UTC)"],
        ([f"<td>{_cell(w.record.start)}</td>", f"<td>{_cell(w.record.end)}</td>", _status(w.status),
          _num(w.record.epoch), _num(w.record.committed_epoch),
          f"<td>{escape(_attempts(w.attempts))}</td>",
          _num(w.record.published_rows), _num(w.record.dead_letter_rows), f"<td>{_cell(w.record.committed_at)}</td>"]
         for w in status.windows),
        f"windows of {status.pipeline}")
    lag = status.lag_note is None
    offsets = _table(
        ["topic", "partition", "committed offset"] + (["end of log", "lag"] if lag else []),
        ([f"<td>{_cell(p.tp.topic)}</td>", _num(p.tp.partition), _num(p.committed_offset)]
         + ([_num(p.end_of_log), _num(p.lag)] if lag else []) for p in status.partitions),
        f"offsets of {status.pipeline}")
    note = f'<p class="meta">{escape(status.lag_note)}</p>' if status.lag_note else ""
    unpublished = status.counts.get(WindowStatus.UNPUBLISHED)
    warning = f'<p class="meta"><strong>{escape(UNPUBLISHED_ADVICE.format(n=unpublished))}</strong></p>' \
        if unpublished else ""
    return (f'<section aria-label="pipeline {name}"><h2>{name}</h2>'
            f'<p class="meta">{escape(counts)} · {owner}{link}</p>{warning}{windows}'
            f"<p class='meta'>Committed offsets (the contiguous committed prefix of its windows)</p>{offsets}{note}"
            f'<p class="meta">Last verify: {escape(status.verify)}</p></section>')


def render(statuses: Sequence[PipelineStatus], *, source: str) -> str:
    """The whole page. ``source`` says where the ledger was read (no secret)."""
    body = "".join(pipeline_section(s) for s in statuses) or \
        "<p>No pipeline in this ledger yet: a window's plan step creates it.</p>"
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Exactly-once windows</title>'
            f"<style>{_STYLE}</style></head><body><h1>Exactly-once windows</h1>"
            f'<p class="meta">Read from the ledger at {escape(source)}; newest windows first.</p>'
            f"{body}</body></html>")
