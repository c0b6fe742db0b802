"""The fault matrix (harness/chaos/matrix.py) of the file target with its roots on HDFS
(the cells of matrix.store_cells: every fault point, both actions, the recoveries rotated)."""

from __future__ import annotations

from harness.chaos.matrix import matrix_module

matrix, test_fault_then_recovery_is_exactly_once = matrix_module("files", store="hdfs")
