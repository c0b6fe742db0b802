"""Targets: one package per kind of target, each a spec and the Sink it builds.

A target package depends on the core (the sink interface, the ledger, the
attempt protocol) and on nothing above it; nothing outside a target's package
names its classes except the user's DAG, which builds the spec. Targets are
found by kind through :mod:`airflow_eos.core.target` (a spec serialises as
``{"kind": ..., ...}``).
"""
