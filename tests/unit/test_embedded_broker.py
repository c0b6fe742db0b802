"""The test broker's cluster id (airflow_eos.embedded.new_cluster_id): one that
starts with "-" made Kafka's StorageTool read it as an option, and the broker
did not start (1 start in 64: a test module's own broker failed so, here)."""

from __future__ import annotations

import uuid

from airflow_eos import embedded


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch):
    dash_first = uuid.UUID(bytes=bytes([0xF8]) + bytes(15))  # base64 of 0b111110.. is "-"
    drawn = iter([dash_first, uuid.UUID(int=1)])
    monkeypatch.setattr(embedded.uuid, "uuid4", lambda: next(drawn))
    cluster_id = embedded.new_cluster_id()
    assert not cluster_id.startswith("-") and len(cluster_id) == 22
    assert next(drawn, None) is None  # the dashed one was drawn and refused
