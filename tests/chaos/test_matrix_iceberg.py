"""The fault matrix (harness/chaos/matrix.py) of the Iceberg target."""

from __future__ import annotations

from harness.chaos.matrix import matrix_module

matrix, test_fault_then_recovery_is_exactly_once = matrix_module("iceberg")
