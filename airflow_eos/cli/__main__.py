"""``python -m airflow_eos.cli``: the ``airflow-eos`` console script."""

import sys

from airflow_eos.cli import main

sys.exit(main())
