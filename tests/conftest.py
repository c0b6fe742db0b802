"""Real services for the tests: one PostgreSQL server and one Apache Kafka
broker per test run (harness.services; or the external ones named by
EOS_POSTGRES_URL and EOS_KAFKA_BOOTSTRAP), one HDFS for the sessions that run an
HDFS test, a fresh database and fresh topics per test, and an Airflow home in a
temp dir. Every process started here is stopped here.

``make test`` runs the suite in pytest-xdist workers (``-n 2 --dist loadfile``):
each worker is a session of its own, with its own Airflow home, on the run's
servers; a module runs whole on one worker (the fault suite's module fixtures
run all of a module's selected cases at once). The slowest modules are handed
out first (harness.workers), and the workers' chaos tallies are summed here.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile

# tests/harness imports as `harness` here (pytest's `pythonpath`); the children a
# test starts do not get pytest's sys.path: spark-submit given --transform
# harness.chaos:spark_transform, its Spark workers, Airflow subprocesses. They get
# tests/ on PYTHONPATH (Spark passes it on to its Python workers).
_TESTS = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_TESTS, os.environ.get("PYTHONPATH")) if p)

# The randomized schedules' first seed, drawn once per pytest command: xdist's
# workers inherit it, so they collect the same test ids (``postgres-SEED``).
os.environ.setdefault("EOS_CHAOS_SEED", str(random.SystemRandom().randrange(1, 10**6)))

# Airflow reads its configuration at import: point it at a throwaway home before
# anything can import it.
_AIRFLOW_HOME = tempfile.mkdtemp(prefix="eos-airflow-home-")
os.environ["AIRFLOW_HOME"] = _AIRFLOW_HOME
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", os.path.join(os.path.dirname(__file__), "..", "dags"))
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_AIRFLOW_HOME}/airflow.db"
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")

import pytest  # noqa: E402
from _pytest.mark.expression import Expression  # noqa: E402

from airflow_eos.embedded import iceberg_rest_service, schema_registry_service  # noqa: E402
from airflow_eos.embedded.kafka import PERFORMANCE_OPTS_ENV  # noqa: E402
from harness import services, workers  # noqa: E402
from harness.databases import RecycledDatabases  # noqa: E402
from harness.jvm import BrokerClassArchive, ClassArchive  # noqa: E402
from harness.topics import TopicFactory  # noqa: E402
from harness.tally import TALLY  # noqa: E402

# --------------------------------------------------------------------------- the session, its workers, the tally


_class_archive: ClassArchive | None = None
_broker_archive: BrokerClassArchive | None = None


def pytest_configure(config):
    workers.configure(config)
    global _class_archive, _broker_archive
    # The run's one process that is no xdist worker (the workers inherit its environment); the unit
    # tests start no JVM.
    if not hasattr(config, "workerinput") and not all(a.startswith("tests/unit") for a in config.args):
        if PERFORMANCE_OPTS_ENV not in os.environ:  # every broker the run starts
            _broker_archive = BrokerClassArchive()
            os.environ[PERFORMANCE_OPTS_ENV] = _broker_archive.broker_opts()
            _broker_archive.start()
        if _selects_slow_tests(config):
            _class_archive = ClassArchive()
            os.environ["SPARK_SUBMIT_OPTS"] = _class_archive.submit_opts()
            _class_archive.start()


def _selects_slow_tests(config) -> bool:
    """Whether ``-m`` lets the tests marked slow run: every test that starts a Spark driver is one
    (pyproject's markers), so ``make test-fast`` (``-m "not slow"``) needs no class archive, whose
    warm-up job cost it ~43 CPU-s."""
    markexpr = config.getoption("markexpr")
    return not markexpr or Expression.compile(markexpr).evaluate(lambda name, **_: name == "slow")


def pytest_collection_modifyitems(session, config, items):
    """The slowest modules first (stable: a module's own order stays), so that
    the xdist workers, which take modules in this order, end together."""
    items.sort(key=workers.rank)


def pytest_runtest_logreport(report):
    """A failed test of the fault suite is a violation (counted where the test
    ran: in its worker, or here without xdist)."""
    if report.failed and "chaos/" in report.nodeid.replace("\\", "/") and not workers.is_controller():
        TALLY.violations += 1
        TALLY.failed.append(report.nodeid)
        workers.log_failure(report)


def pytest_sessionfinish(session, exitstatus):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the tally to the controller
        workeroutput["chaos_tally"] = TALLY.to_dict()
    shutil.rmtree(_AIRFLOW_HOME, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist brings up a worker: it is to use the run's servers."""
    services.hand_to_worker(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, with the longest modules split (harness/workers.py)."""
    return workers.scheduler(config, log)


def pytest_unconfigure(config):
    services.stop()
    for archive in (_class_archive, _broker_archive):
        if archive is not None:
            archive.stop()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """An xdist worker ended: add its chaos tally to the session's."""
    TALLY.merge(getattr(node, "workeroutput", {}).get("chaos_tally") or {})


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = TALLY.lines()
    if lines:
        terminalreporter.write_sep("-", "chaos")
        for line in lines:
            terminalreporter.write_line(line)


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="session")
def pg_server(pytestconfig):
    """The run's PostgreSQL server (embedded unless EOS_POSTGRES_URL is set)."""
    with services.postgres(pytestconfig) as handle:
        yield handle


@pytest.fixture(scope="session")
def recycled_databases(pg_server):
    """The session's databases for ``pg_url``, handed from test to test wiped (harness/databases.py)."""
    databases = RecycledDatabases(pg_server.address)
    yield databases
    databases.close()


@pytest.fixture
def pg_url(request, recycled_databases):
    """A database of the test's own on the session's server, as a new one is: empty, or with the ledger
    migrated when the test asks for ``ledger``. Under a name no test had; wiped and renamed afterwards."""
    with recycled_databases.database(ledger="ledger" in request.fixturenames) as url:
        yield url


@pytest.fixture
def ledger(pg_url):
    from airflow_eos.core.ledger import Ledger

    ledger = Ledger(pg_url)
    ledger.migrate()
    return ledger


# --------------------------------------------------------------------------- Kafka


@pytest.fixture(scope="session")
def kafka(pytestconfig, pg_server):
    """The run's Apache Kafka, one KRaft node (unless EOS_KAFKA_BOOTSTRAP names one).

    Depends on pg_server only so that both start in a fixed order."""
    with services.kafka(pytestconfig) as handle:
        yield handle


@pytest.fixture
def kafka_config(kafka):
    return {"bootstrap.servers": kafka.address}


@pytest.fixture
def topics(kafka):
    factory = TopicFactory(kafka.address)
    yield factory
    factory.close()


# --------------------------------------------------------------------------- HDFS


@pytest.fixture(scope="session")
def hdfs(pytestconfig):
    """HDFS (a NameNode and a DataNode, Hadoop's mini-cluster), the run's (one for all xdist workers:
    harness/services.py); started when a test first asks for it, so a run without HDFS tests starts none."""
    with services.on_demand(pytestconfig, "hdfs") as handle:
        yield handle


# --------------------------------------------------------------------------- the schema registry


@pytest.fixture(scope="session")
def schema_registry():
    """A schema registry (Apicurio Registry, Confluent's REST API, schemas in memory) of the session's
    own; started by the first test that asks for it, so a worker without Avro tests starts none."""
    with schema_registry_service() as handle:
        yield handle


# --------------------------------------------------------------------------- an Iceberg REST catalog


@pytest.fixture(scope="session")
def iceberg_rest():
    """Iceberg's REST catalog test server (a JdbcCatalog on SQLite) of the session's own; started by the
    first test that asks for it. Its tables outlive a test: each test names its own."""
    with iceberg_rest_service() as handle:
        yield handle


# --------------------------------------------------------------------------- an object store


@pytest.fixture(scope="session")
def s3():
    """An S3 endpoint of the session's own (moto's server, in memory: tests/harness/object_store.py)."""
    from harness.object_store import start_s3

    server, endpoint = start_s3()
    yield endpoint
    server.stop()


# --------------------------------------------------------------------------- Airflow


@pytest.fixture(scope="session")
def airflow_db():
    """Airflow's metadata DB (SQLite in the temp home), initialised once."""
    from airflow.utils import db

    db.initdb()
    return os.environ["AIRFLOW_HOME"]


# --------------------------------------------------------------------------- sinks


@pytest.fixture
def freeze_windows(ledger):
    """Plans windows straight into the ledger, without a broker, as the planner
    would freeze them: hourly windows from 2024-01-01T00:00Z, window ``i`` holding
    offsets ``[i * per_window, (i + 1) * per_window)`` of every partition.
    ``freeze_windows(pipeline, [3, 1, 2])`` plans windows 3, 1 and 2 in that
    order and returns their WindowPlans in that order."""
    from datetime import datetime, timedelta, timezone

    from airflow_eos.core.windows import PartitionRange, Window, WindowPlan

    def freeze(pipeline, indices=(0,), *, partitions=(("orders", 0), ("orders", 1)), per_window=5):
        origin = datetime(2024, 1, 1, tzinfo=timezone.utc)
        plans = []
        with ledger.connect() as conn:
            for i in indices:
                window = Window(pipeline, origin + timedelta(hours=i), origin + timedelta(hours=i + 1))
                plan = WindowPlan(window, tuple(sorted(
                    PartitionRange(topic, p, i * per_window, (i + 1) * per_window) for topic, p in partitions
                )))
                with conn.transaction():
                    ledger.lock_pipeline(conn, pipeline)
                    ledger.freeze(conn, plan, [])
                plans.append(plan)
        return plans

    return freeze
