"""What the tests drive the product with, kept out of the installed package:
the chaos driver (``chaos``), a live Airflow stack and its REST client
(``airflow_stack``), the Airflow UI in headless Chromium through Selenium (``browser``), the password-leak check (``leaks``) and a real full disk
(``full_disk``).

Imported as ``harness``: pytest puts ``tests/`` on ``sys.path`` (``pythonpath``
in pyproject.toml) and tests/conftest.py puts it on ``PYTHONPATH`` too, so the
children a test starts (spark-submit with ``--transform
harness.chaos:spark_transform``, its Spark workers, Airflow subprocesses) import
it as the test does.
"""
