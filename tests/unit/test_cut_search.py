"""The cut search over an in-memory log: pure logic, checked against brute force."""

import bisect
import math
from datetime import datetime, timedelta, timezone
from unittest.mock import patch

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_eos.core.errors import SkewedTimestamp
from airflow_eos.core.ledger import CutContext
from airflow_eos.core import cut_search, plan, skew
from airflow_eos.core.cut_search import first_offset_at_or_after
from airflow_eos.core.plan import resolve_cut
from airflow_eos.core.source import Bounds
from airflow_eos.core.windows import CUT_BY_IDLE, CUT_BY_NEIGHBOUR, CUT_BY_RECORD, CUT_NEW_PARTITION, to_millis
from memlog import MemoryLog

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@st.composite
def logs(draw, monotone=True):
    steps = draw(st.lists(st.integers(0, 5) if monotone else st.integers(-5, 5), min_size=0, max_size=1500))
    timestamps, ts = [], 1000
    for s in steps:
        ts = max(0, ts + s)
        timestamps.append(ts)
    gaps = set(draw(st.lists(st.integers(0, len(steps) * 2), max_size=20)))
    log = MemoryLog()
    tp = log.add_partition("t", 0, timestamps, gaps=gaps)
    return log, tp


# The logs drawn are short; a small scan threshold makes the search probe them
# (interpolating, halving) instead of reading them whole.
scan_thresholds = st.sampled_from([4, 16, cut_search.SCAN_BELOW])


@settings(max_examples=300, deadline=None)
@given(data=st.data(), monotone_log=logs(), scan_below=scan_thresholds)
def test_search_finds_the_first_record_at_or_after_t(data, monotone_log, scan_below):
    log, tp = monotone_log
    end = log.ends[tp]
    t = data.draw(st.integers(900, 1000 + 5 * 1600))
    lo = data.draw(st.integers(0, end))
    log.hint = data.draw(st.one_of(st.none(), st.integers(0, end + 3)))  # right, wrong or absent
    expected = next((r.offset for r in log.logs[tp] if r.offset >= lo and r.timestamp_ms >= t), None)
    with patch.object(cut_search, "SCAN_BELOW", scan_below):
        assert first_offset_at_or_after(log, tp, t, lo, end) == expected


@settings(max_examples=200, deadline=None)
@given(data=st.data(), skewed_log=logs(monotone=False), scan_below=scan_thresholds)
def test_search_on_skewed_timestamps_still_returns_a_boundary(data, skewed_log, scan_below):
    """With non-monotone timestamps any boundary is acceptable, as long as it is
    one: the record at the cut is >= t and the record before it (if any) is < t."""
    log, tp = skewed_log
    end = log.ends[tp]
    t = data.draw(st.integers(900, 1000 + 5 * 1600))
    with patch.object(cut_search, "SCAN_BELOW", scan_below):
        found = first_offset_at_or_after(log, tp, t, 0, end)
    recs = {r.offset: r for r in log.logs[tp]}
    if found is None:
        return
    assert recs[found].timestamp_ms >= t
    before = [r for r in log.logs[tp] if r.offset < found]
    if before:
        assert before[-1].timestamp_ms < t


def test_search_with_a_correct_hint_needs_few_probes():
    log = MemoryLog()
    tp = log.add_partition("t", 0, range(100_000))
    log.hint = 70_000
    assert first_offset_at_or_after(log, tp, 70_000, 0, 100_000) == 70_000
    assert log.probes <= 3


def test_search_with_a_lying_hint_on_a_steady_log_takes_a_few_probes():
    """Every probe is a fetch round trip. A window of an hour written at a steady
    rate (the benchmark's 250k records a partition, one late record closing it):
    the start cut is the first record, the end cut is bracketed by interpolation."""
    log = MemoryLog()
    n = 250_000
    tp = log.add_partition("t", 0, [i * 3_599_000 // n for i in range(n)] + [3_601_000])
    log.hint = 0  # what the embedded broker answers to every offsets_for_times
    assert first_offset_at_or_after(log, tp, 0, 0, n + 1) == 0
    assert log.probes == 1
    log.probes = 0
    assert first_offset_at_or_after(log, tp, 3_600_000, 0, n + 1) == n
    assert log.probes <= 4
    log.probes = 0
    middle = 1_234_567
    assert first_offset_at_or_after(log, tp, middle, 0, n + 1) == -(-middle * n // 3_599_000)
    assert log.probes <= 6  # halving took 9


@pytest.mark.parametrize("shape", ["burst at the end", "burst at the start", "idle hour in the middle",
                                   "equal timestamps"])
def test_search_on_an_uneven_log_takes_at_most_one_probe_more_than_halving(shape):
    """Interpolation guesses badly where the rate changes; the ITP search keeps
    each guess close enough to the middle that halving never needs fewer probes
    (plus one, and the two probes at the ends that steer the guesses)."""
    n = 1_000_000
    if shape == "burst at the end":  # a tenth of the records over 59 minutes, the rest in the last one
        timestamps = [i * 36 for i in range(n // 10)] + [3_540_000 + i // 15 for i in range(n - n // 10)]
    elif shape == "burst at the start":
        timestamps = [i // 15 for i in range(n - n // 10)] + [60_000 + i * 36 for i in range(n // 10)]
    elif shape == "idle hour in the middle":
        timestamps = [i for i in range(n // 2)] + [3_600_000 + i for i in range(n // 2)]
    else:
        timestamps = [0] * (n // 2) + [5] * (n // 2)
    log = MemoryLog()
    tp = log.add_partition("t", 0, timestamps)
    bisection_steps = math.ceil(math.log2(n / cut_search.SCAN_BELOW))
    for t in (1, 1_000, 59_999, 60_001, 1_800_000, 3_540_001, 3_599_999, 3_600_000, 3_600_500, 4_000_000):
        log.probes = 0
        expected = bisect.bisect_left(timestamps, t)
        assert first_offset_at_or_after(log, tp, t, 0, n) == (expected if expected < n else None)
        assert log.probes <= 2 + bisection_steps + 1, (t, log.probes)


def _ms(t):
    return to_millis(t)


def test_resolve_cut_waits_then_freezes_idle_partition_at_end_of_log():
    log = MemoryLog()
    tp = log.add_partition("t", 0, [_ms(T0) + i for i in range(10)])
    at = T0 + timedelta(hours=1)
    grace = timedelta(minutes=5)
    b = log.bounds(tp)
    assert resolve_cut(log, tp, at, CutContext(), b, now=at + timedelta(minutes=4),
                       idle_partition_grace=grace) is None
    cut = resolve_cut(log, tp, at, CutContext(), b, now=at + grace, idle_partition_grace=grace)
    assert (cut.offset, cut.how) == (10, CUT_BY_IDLE)


def test_resolve_cut_empty_partition_is_idle_at_zero():
    log = MemoryLog()
    tp = log.add_partition("t", 0, [])
    cut = resolve_cut(log, tp, T0, CutContext(), log.bounds(tp), now=T0 + timedelta(hours=1),
                      idle_partition_grace=timedelta(0))
    assert (cut.offset, cut.how) == (0, CUT_BY_IDLE)


def test_resolve_cut_is_clamped_between_frozen_neighbours():
    log = MemoryLog()
    tp = log.add_partition("t", 0, [_ms(T0) + i * 1000 for i in range(100)])
    at = T0 + timedelta(seconds=50)
    b = log.bounds(tp)
    kw = dict(now=T0, idle_partition_grace=timedelta(hours=1))
    assert resolve_cut(log, tp, at, CutContext(), b, **kw).offset == 50
    # a neighbour frozen at an earlier instant above the record cut: the search
    # starts there, never below it
    cut = resolve_cut(log, tp, at, CutContext(lower=60), b, **kw)
    assert (cut.offset, cut.how) == (60, CUT_BY_RECORD)
    cut = resolve_cut(log, tp, at, CutContext(upper=40), b, **kw)
    assert (cut.offset, cut.how) == (40, CUT_BY_NEIGHBOUR)
    # no record >= t below the upper neighbour: the cut is the neighbour itself
    late = T0 + timedelta(seconds=500)
    cut = resolve_cut(log, tp, late, CutContext(upper=100), b, **kw)
    assert (cut.offset, cut.how) == (100, CUT_BY_NEIGHBOUR)
    assert resolve_cut(log, tp, at, CutContext(frozen=7), b, **kw).offset == 7


def test_resolve_cut_new_partition_starts_at_log_start():
    log = MemoryLog()
    tp = log.add_partition("t", 3, [_ms(T0) + i for i in range(10)])
    log.log_start[tp] = 4
    cut = resolve_cut(log, tp, T0 + timedelta(hours=1), CutContext(new_partition=True), log.bounds(tp),
                      now=T0, idle_partition_grace=timedelta(0))
    assert (cut.offset, cut.how) == (4, CUT_NEW_PARTITION)


def test_resolve_cut_searches_only_what_retention_left():
    log = MemoryLog()
    tp = log.add_partition("t", 0, [_ms(T0) + i * 1000 for i in range(100)])
    log.log_start[tp] = 30
    cut = resolve_cut(log, tp, T0 + timedelta(seconds=10), CutContext(lower=5), Bounds(30, 100),
                      now=T0, idle_partition_grace=timedelta(hours=1))
    assert (cut.offset, cut.how) == (30, CUT_BY_RECORD)


# --------------------------------------------------------------------------- skewed timestamps

Y2030 = _ms(datetime(2030, 1, 1, tzinfo=timezone.utc))
HOUR = timedelta(hours=1)


def _issue_log(outliers=1, hours=10):
    """A record every 6 minutes from T0; after the 10th, ``outliers`` records
    stamped 2030 (issue 16): offsets 0-9 hour 0, then the outliers, then hour 1 on."""
    log = MemoryLog()
    sane = [_ms(T0) + i * 360_000 for i in range(10 * hours)]
    tp = log.add_partition("t", 1, sane[:10] + [Y2030] * outliers + sane[10:])
    return log, tp


def _cut(log, tp, at, ctx=CutContext(), **rules):
    return resolve_cut(log, tp, at, ctx, log.bounds(tp), now=T0 + timedelta(days=30),
                       idle_partition_grace=timedelta(minutes=5), **rules)


def test_a_skewed_record_fails_the_cut_naming_partition_offset_and_timestamps():
    log, tp = _issue_log()
    # Window 1's end: the records after the outlier are not older than T0+1h, so it is a sane cut.
    assert (_cut(log, tp, T0 + HOUR).offset, _cut(log, tp, T0 + HOUR).how) == (10, CUT_BY_RECORD)
    # Window 2's end, from the frozen cut 10: the old code froze [10, 10) here, window after window.
    with pytest.raises(SkewedTimestamp) as caught:
        _cut(log, tp, T0 + 2 * HOUR, CutContext(lower=10))
    text = str(caught.value)
    assert "t[1] offset 10 is stamped 2030-01-01T00:00:00+00:00" in text
    assert "window boundary 2026-01-01T02:00:00+00:00" in text
    assert "offset 11 after it is stamped 2026-01-01T01:00:00+00:00" in text
    assert 'on_skewed_timestamp="position"' in text and "max_timestamp_skew (1:00:00)" in text


def test_position_passes_over_a_skewed_record(caplog):
    log, tp = _issue_log()
    with caplog.at_level("WARNING", logger="airflow_eos.core.plan"):
        cut = _cut(log, tp, T0 + 2 * HOUR, CutContext(lower=10), on_skewed_timestamp="position")
    assert (cut.offset, cut.how) == (21, plan.CUT_BY_SKEWED)  # the first record of hour 2
    assert "offset 10 stamped 2030-01-01T00:00:00+00:00 (offset 11 after it: 2026-01-01T01:00:00+00:00)" \
        in caplog.text
    # the next boundary is sane again
    assert _cut(log, tp, T0 + 3 * HOUR, CutContext(lower=21), on_skewed_timestamp="position").how == CUT_BY_RECORD


def test_a_burst_of_skewed_records_is_passed_over_as_one():
    """Eight records stamped 2030 in a row: the whole burst goes to one window."""
    log, tp = _issue_log(outliers=8)
    with pytest.raises(SkewedTimestamp, match="offset 10 is stamped 2030.*offset 18 after it"):
        _cut(log, tp, T0 + 2 * HOUR, CutContext(lower=10))
    log.probes = log.reads = 0
    cut = _cut(log, tp, T0 + 2 * HOUR, CutContext(lower=10), on_skewed_timestamp="position")
    assert (cut.offset, cut.how) == (28, plan.CUT_BY_SKEWED)
    assert log.reads <= 3  # the search's scan, one read behind the first skewed record (the rest of it)


def test_a_skewed_record_at_the_end_of_the_log_holds_nothing_yet():
    """Nothing older follows it yet: a sane cut. Once older records arrive, the
    next boundary sees it (the record is not lost either way)."""
    log = MemoryLog()
    tp = log.add_partition("t", 0, [_ms(T0) + i * 360_000 for i in range(10)] + [Y2030])
    for policy in skew.ON_SKEWED_TIMESTAMP:
        assert (_cut(log, tp, T0 + HOUR, on_skewed_timestamp=policy).offset) == 10
    log.append(tp, [_ms(T0 + HOUR) + i * 360_000 for i in range(20)])
    with pytest.raises(SkewedTimestamp, match="offset 10 is stamped 2030"):
        _cut(log, tp, T0 + 2 * HOUR, CutContext(lower=10))
    # only skewed records beyond the boundary: the partition has not passed it (waits, then idles)
    log2 = MemoryLog()
    tp2 = log2.add_partition("t", 0, [_ms(T0) + i * 360_000 for i in range(10)] + [Y2030, _ms(T0) + 3_600_000 - 1])
    b = log2.bounds(tp2)
    rules = dict(idle_partition_grace=timedelta(minutes=5), on_skewed_timestamp="position")
    assert resolve_cut(log2, tp2, T0 + HOUR, CutContext(), b, now=T0 + HOUR, **rules) is None
    idle = resolve_cut(log2, tp2, T0 + HOUR, CutContext(), b, now=T0 + 2 * HOUR, **rules)
    assert (idle.offset, idle.how) == (12, CUT_BY_IDLE)  # the skewed record is in the window of its position


def test_a_skewed_record_seen_only_in_the_newest_records():
    """Far from the cut, the partition's newest records still show it holds them."""
    log = MemoryLog()
    tp = log.add_partition("t", 0, [_ms(T0)] + [Y2030] * 2000 + [_ms(T0) + 60_000])
    log.hint = 1  # a real Kafka's time index answers the first record stamped >= t: the outlier
    with pytest.raises(SkewedTimestamp, match=r"offset 1 is stamped 2030.*offset 2001 after it"):
        _cut(log, tp, T0 + HOUR)
    # position: the burst, longer than one read, is passed over read by read; no
    # record at/after the boundary is left, so the partition idles to its end
    cut = _cut(log, tp, T0 + HOUR, on_skewed_timestamp="position")
    assert (cut.offset, cut.how) == (2002, CUT_BY_IDLE)


def test_sane_logs_pay_nothing_for_the_skew_check():
    """Same probes and reads as the plain search: records stamped within the
    skew (a late-running partition, an hour-long silence within the skew) are
    never looked behind, and a silence longer than the skew with no older
    record after it is a sane cut."""
    log = MemoryLog()
    n = 250_000
    stamps = [_ms(T0) + i * 3_599_000 // n for i in range(n)] + [_ms(T0) + 3_600_000 + 50 * 60_000]
    tp = log.add_partition("t", 0, stamps + [_ms(T0) + 5 * 3_600_000])  # then silent 3 hours
    log.hint = 0
    for at, look_behind in ((T0 + timedelta(minutes=17), 0), (T0 + HOUR, 0), (T0 + 2 * HOUR, 1)):
        log.probes = log.reads = 0
        plain = first_offset_at_or_after(log, tp, _ms(at), 0, log.ends[tp])
        expected = (log.probes, log.reads + look_behind)
        log.probes = log.reads = 0
        cut = _cut(log, tp, at)
        assert (cut.offset, cut.how) == (plain, CUT_BY_RECORD)
        assert (log.probes, log.reads) == expected, at
    # (at T0+2h the cut's record is 3 hours beyond it: one read looks behind, nothing older follows)
    assert plain == n + 1


def test_the_skew_rule_is_checked():
    window = plan.Window("p", T0, T0 + HOUR)
    with pytest.raises(plan.ConfigurationError, match=r"max_timestamp_skew of pipeline 'p' must be a positive"):
        plan.PlanRequest(window, ("t",), max_timestamp_skew=timedelta(0))
    with pytest.raises(plan.ConfigurationError, match=r"max_timestamp_skew .* got 3600"):
        plan.PlanRequest(window, ("t",), max_timestamp_skew=3600)
    with pytest.raises(plan.ConfigurationError, match=r"on_skewed_timestamp .* be 'fail' or 'position', got 'skip'"):
        plan.PlanRequest(window, ("t",), on_skewed_timestamp="skip")


@pytest.mark.parametrize("burst", [8, 5000, 100_000])
def test_a_burst_longer_than_the_read_is_found_by_probes(burst):
    """A producer's wrong clock for a while: a run of records stamped 2030, longer
    than the read behind the first (SCAN_BELOW offsets), then the log as it was,
    with newest records that are not older than the boundary. Probes find where
    the run ends; a few per doubling of its length."""
    log, tp = _issue_log(outliers=burst)
    first_after = 10 + burst
    with patch.object(cut_search, "SCAN_BELOW", 4 if burst == 8 else cut_search.SCAN_BELOW):
        with pytest.raises(SkewedTimestamp, match=rf"offset 10 is stamped 2030.*offset {first_after} after it"):
            _cut(log, tp, T0 + 2 * HOUR, CutContext(lower=10))
        log.probes = log.reads = 0
        cut = _cut(log, tp, T0 + 2 * HOUR, CutContext(lower=10), on_skewed_timestamp="position")
    assert (cut.offset, cut.how) == (first_after + 10, plan.CUT_BY_SKEWED)  # hour 1 is in this window too
    assert log.probes <= 2 * math.log2(max(burst, 2)) + 12, log.probes


def test_a_silent_partition_is_not_a_burst():
    """A partition silent for three hours, then the log goes on: the cut's record
    is beyond the skew, nothing after it is older than the boundary, and the
    probes that look for the run's end stop at the newest records."""
    log = MemoryLog()
    tp = log.add_partition("t", 0, [_ms(T0) + i * 360_000 for i in range(10)]
                           + [_ms(T0 + 4 * HOUR) + i * 100 for i in range(200_000)])
    log.probes = 0
    cut = _cut(log, tp, T0 + HOUR, CutContext(lower=10))
    assert (cut.offset, cut.how) == (10, CUT_BY_RECORD)
    assert log.probes <= 2 * math.log2(200_000 / cut_search.SCAN_BELOW) + 4
