from datetime import datetime, timedelta, timezone

import pytest

from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.plan import PlanRequest
from airflow_eos.core.windows import PartitionRange, Window, WindowPlan

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_window_refuses_start_not_before_end():
    with pytest.raises(ConfigurationError, match="not before end"):
        Window("p", T0, T0)
    with pytest.raises(ConfigurationError, match="not before end"):
        Window("p", T0 + timedelta(hours=1), T0)


def test_window_refuses_naive_datetimes_and_empty_pipeline():
    with pytest.raises(ConfigurationError, match="no time zone"):
        Window("p", datetime(2026, 1, 1), datetime(2026, 1, 2))
    with pytest.raises(ConfigurationError, match="pipeline"):
        Window("", T0, T0 + timedelta(hours=1))


def test_window_normalises_to_utc():
    cet = timezone(timedelta(hours=1))
    w = Window("p", datetime(2026, 1, 1, 1, tzinfo=cet), datetime(2026, 1, 1, 2, tzinfo=cet))
    assert w.start == T0 and w.start.tzinfo == timezone.utc


def test_plan_round_trips_through_json():
    plan = WindowPlan(Window("p'; drop", T0, T0 + timedelta(hours=1)),
                      (PartitionRange("a", 0, 5, 10), PartitionRange("a", 1, 0, 0)))
    again = WindowPlan.from_json(plan.to_json())
    assert again == plan
    assert again.max_records == 5 and again.topics == ("a",)


@pytest.mark.parametrize("topics, message", [
    ([], "topic list of pipeline .p. is empty"),
    ("orders", "not the string"),
    (["a", "a"], "duplicates"),
    (["a", ""], "non-empty"),
])
def test_plan_request_refuses_bad_topic_lists(topics, message):
    with pytest.raises(ConfigurationError, match=message):
        PlanRequest(Window("p", T0, T0 + timedelta(hours=1)), topics)
