"""The stage job, as ``spark-submit`` runs it (see airflow_eos.spark.submit for
the contract: arguments, and the target and Kafka settings in the environment)::

    spark-submit --master local[2] airflow_eos/spark/job.py --plan PLAN_JSON --attempt ATTEMPT_JSON \\
        --max-records-per-task N --max-bad-records N [--transform module:function]

Master and conf come from spark-submit, so it runs unchanged on a cluster (whose
executors need airflow-eos installed, or shipped with ``--py-files``). The work is
in :mod:`airflow_eos.spark.stage`; in-process callers use :func:`run_stage`.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    # Run as a script, Python puts this file's directory first on the path, where
    # session.py, stage.py & co. would shadow any top-level module of those names.
    del sys.path[0]

from airflow_eos.spark.stage import StageReport, main, run_stage

__all__ = ["StageReport", "main", "run_stage"]

if __name__ == "__main__":
    sys.exit(main())
