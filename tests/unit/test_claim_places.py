"""The rules of claims with places (core/ownership.py, issue 33 item 1): two
claims share a target by id or by place; a place resolved later fills in a
claim recorded without one."""

from airflow_eos.core.ownership import Claim, shared_target_conflict

PLACE = "kafka-cluster:abc/out"


def test_another_connection_id_of_one_place_is_the_same_target():
    first = Claim("a", ("orders",), "dag_a", "kafka:conn_a/out", place=PLACE)
    second = Claim("b", ("orders",), "dag_b", "kafka:conn_b/out", place=PLACE)
    reason = shared_target_conflict(first, second)
    assert reason is not None and "published twice" in reason
    assert PLACE in reason and "kafka:conn_a/out" in reason and "kafka:conn_b/out" in reason
    # disjoint topics may share it, as before
    assert shared_target_conflict(first, Claim("c", ("refunds",), "dag_c", "kafka:conn_b/out", place=PLACE)) is None
    # another place and another id: another target
    assert shared_target_conflict(first, Claim("d", ("orders",), "dag_d", "kafka:conn_b/out",
                                                place="kafka-cluster:xyz/out")) is None


def test_a_claim_without_place_is_matched_by_its_id_and_filled_in():
    old = Claim("a", ("orders",), "dag_a", "kafka:conn_a/out")  # recorded before migration 11
    assert shared_target_conflict(old, Claim("b", ("orders",), "dag_b", "kafka:conn_a/out", place=PLACE))
    asked = Claim("a", ("orders",), "dag_a", "kafka:conn_a/out", place=PLACE)
    assert not old.covers(asked)  # the plan writes the place
    assert old.filled_from(asked).place == PLACE
    assert old.filled_from(asked).covers(asked)
    assert old.covers(Claim("a", ("orders",), "dag_a", "kafka:conn_a/out"))  # a plan that resolved no place
