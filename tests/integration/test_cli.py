"""The ``airflow-eos`` CLI against real services: in-process through ``main``,
and once as the installed console script."""

from __future__ import annotations

import io
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_eos.cli import main, parse_duration
from airflow_eos.core.source import KafkaLog
from airflow_eos.core.windows import TopicPartition
from airflow_eos.embedded import free_port
from harness.leaks import PASSWORD, leaked
from test_verify import ORDERS_DDL, PIPELINE, build, execute

SCRIPT = Path(sys.executable).parent / "airflow-eos"


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def orders(pg_url, ledger):
    from airflow_eos.targets.postgres.target import PostgresTarget

    execute(pg_url, ORDERS_DDL)
    return PostgresTarget(pg_url, "orders")


@pytest.fixture
def committed(ledger, kafka_config, orders):
    """Windows 0 and 1 committed, window 2 planned with one aborted and one open attempt."""
    sink = orders.sink()
    built = build(ledger, kafka_config, sink, commit=[0, 1])
    sink.abort(sink.begin(built.plans[2].window), "stage failed")
    built.open_attempt = sink.begin(built.plans[2].window)
    return built


def lines_with(text, *words):
    return [line for line in text.splitlines() if all(w in line for w in words)]


# --------------------------------------------------------------------------- status


def test_status_shows_windows_attempts_offsets_and_lag(pg_url, kafka_config, committed):
    code, out, err = run("status", "--pipeline", PIPELINE, "--postgres-url", pg_url,
                         "--kafka-bootstrap", kafka_config["bootstrap.servers"])
    assert (code, err) == (0, "")
    assert out.startswith(f"pipeline {PIPELINE}: 3 window(s), 2 committed, 1 planned\n")
    [w0] = lines_with(out, "2024-01-01 00:00:00  2024-01-01 01:00:00")
    assert w0.split()[4:8] == ["committed", "1", "1", "committed"] and w0.split()[8:10] == ["6", "0"]
    [w2] = lines_with(out, "2024-01-01 02:00:00  2024-01-01 03:00:00")
    assert "planned" in w2 and "1 open, 1 aborted" in w2 and w2.split()[-3:] == ["-", "-", "-"]

    with KafkaLog(kafka_config) as log_:
        ends = {p: log_.bounds(TopicPartition(committed.topic, p)).end for p in (0, 1)}
    committed_at = {r.partition: r.end_offset for r in committed.plans[1].ranges}
    assert lines_with(out, "partition", "committed offset", "end of log", "lag")
    for p in (0, 1):
        [row] = lines_with(out, f"{committed.topic}[{p}]")
        assert row.split() == [f"{committed.topic}[{p}]", str(committed_at[p]), str(ends[p]),
                               str(ends[p] - committed_at[p])]
        assert ends[p] - committed_at[p] > 0


def test_status_without_kafka_and_with_a_limit(pg_url, committed):
    code, out, _ = run("status", "--pipeline", PIPELINE, "--postgres-url", pg_url, "--limit", "1")
    assert code == 0
    assert "showing the latest 1; --limit 0 shows all" in out
    assert not lines_with(out, "2024-01-01 00:00:00  2024-01-01 01:00:00")
    assert lines_with(out, "partition", "committed offset") and not lines_with(out, "lag ")
    assert "pass --kafka-bootstrap, --kafka-config or --kafka-conn-id to see the end of each log and the lag" in out

    code, out, err = run("status", "--pipeline", "nope", "--postgres-url", pg_url)
    assert (code, out) == (2, "")
    assert err.startswith("airflow-eos status: error: pipeline 'nope' has no windows") and \
        err.rstrip().endswith("; it knows: orders_hourly")


# --------------------------------------------------------------------------- verify


def test_verify_clean_exits_0_and_a_violation_exits_1(pg_url, kafka_config, committed, monkeypatch):
    monkeypatch.setenv("EOS_POSTGRES_URL", pg_url)
    monkeypatch.setenv("EOS_KAFKA_BOOTSTRAP", kafka_config["bootstrap.servers"])
    code, out, err = run("verify", "--pipeline", PIPELINE, "--table", "orders")
    assert (code, err) == (0, ""), out
    assert out.startswith(f"verify {PIPELINE} against orders (record lineage) in ")
    assert "CLEAN: every record of 2 committed window(s) is published exactly once or is a dead letter" in out
    [total] = lines_with(out, "total")
    assert total.split() == ["total", "12", "12", "0", "0", "0", "0"]
    assert "partition offsets: 2 partition(s) in the contiguous committed prefix, eos.partition_offsets matches" \
        in out
    assert last_verify(pg_url) == {"target": "orders", "clean": True, "committed_windows": 2, "kafka_records": 12,
                                   "published_rows": 12, "dead_letters": 0, "duplicates": 0, "missing": 0,
                                   "extra": 0, "violations": 0}

    offset = committed.records(committed.plans[1], 0)[0]
    execute(pg_url, "DELETE FROM orders WHERE eos_partition = 0 AND eos_offset = %s", (offset,))
    code, out, _ = run("verify", "--pipeline", PIPELINE, "--table", "orders")
    assert code == 1
    [window] = lines_with(out, "2024-01-01 01:00:00", "committed")
    assert window.split()[-6:] == ["5", "0", "0", "1", "0", "VIOLATION"]
    assert "VIOLATIONS: 2" in out
    assert lines_with(out, "missing", f"window 2024-01-01T01:00:00+00:00: {committed.topic}[0] offset {offset} "
                                      "is in Kafka but neither published nor a dead letter")
    assert lines_with(out, "count", "the target holds 5 rows, the ledger recorded 6")
    # the status page's "last verify" is this run's: replaced, not appended
    assert last_verify(pg_url) == {"target": "orders", "clean": False, "committed_windows": 2, "kafka_records": 12,
                                   "published_rows": 11, "dead_letters": 0, "duplicates": 0, "missing": 1,
                                   "extra": 0, "violations": 2}


def last_verify(pg_url: str) -> dict:
    """The pipeline's last verify as the ledger keeps it, without its time."""
    from airflow_eos.core.ledger import Ledger

    ledger = Ledger(pg_url)
    with ledger.connect() as conn:
        run = ledger.last_verify_run(conn, PIPELINE)
        (n,) = conn.execute("SELECT count(*) FROM eos.verify_runs").fetchone()
    assert n == 1 and run is not None
    del run["verified_at"]
    return run


def test_verify_usage_and_connection_errors_exit_2(pg_url, kafka_config, committed, capsys, monkeypatch):
    monkeypatch.delenv("EOS_POSTGRES_URL", raising=False)
    monkeypatch.delenv("EOS_KAFKA_BOOTSTRAP", raising=False)
    bootstrap = kafka_config["bootstrap.servers"]
    base = ["verify", "--pipeline", PIPELINE, "--table", "orders"]

    assert main(["verify", "--pipeline", PIPELINE, "--table", "t", "--topic", "t"]) == 2  # argparse
    assert "argument --topic: not allowed with argument --table" in capsys.readouterr().err
    assert main(["verify", "--pipeline", PIPELINE, "--postgres-url", "x", "--postgres-conn-id", "y"]) == 2
    assert "argument --postgres-conn-id: not allowed with argument --postgres-url" in capsys.readouterr().err

    cases = [
        (base + ["--kafka-bootstrap", bootstrap], "no database given: pass --postgres-url, --postgres-conn-id or "
         "set EOS_POSTGRES_URL; the default Airflow connection 'postgres_default' (postgres) cannot be read: The "
         "conn_id `postgres_default` isn't defined; define it (e.g. AIRFLOW_CONN_POSTGRES_DEFAULT"),
        (base + ["--postgres-url", pg_url], "no Kafka given: pass --kafka-bootstrap, --kafka-config, --kafka-conn-id "
         "or set EOS_KAFKA_BOOTSTRAP; the default Airflow connection 'kafka_default' (kafka) cannot be read"),
        (base + ["--postgres-url", pg_url, "--kafka-conn-id", "elsewhere"], "--kafka-conn-id Airflow connection "
         "'elsewhere' (kafka) cannot be read: The conn_id `elsewhere` isn't defined"),
        (base + ["--postgres-url", pg_url, "--kafka-config", '{"client.id": "x"}'],
         "--kafka-config names no bootstrap.servers"),
        (base + ["--postgres-url", pg_url, "--kafka-config", "{not json"], "--kafka-config is not valid JSON"),
        (base + ["--postgres-url", f"postgresql://postgres:s3cr3t-pw@127.0.0.1:{free_port()}/x", "--kafka-bootstrap",
                 bootstrap], "cannot connect to the ledger database postgresql://postgres:***@127.0.0.1:"),
        (["verify", "--pipeline", "nope", "--table", "orders", "--postgres-url", pg_url, "--kafka-bootstrap",
          bootstrap], "pipeline 'nope' has no windows in the ledger at"),
        (base[:-1] + ["missing", "--postgres-url", pg_url, "--kafka-bootstrap", bootstrap],
         "target table missing does not exist"),
    ]
    for argv, message in cases:
        code, out, err = run(*argv)
        assert (code, out) == (2, ""), argv
        assert err.startswith("airflow-eos verify: error: ") and message in err, err
        assert "s3cr3t" not in err


# --------------------------------------------------------------------------- sweep


def test_sweep_aborts_stale_attempts_and_dry_run_only_lists(pg_url, committed):
    stale = committed.open_attempt
    code, out, _ = run("sweep", "--older-than", "1h", "--postgres-url", pg_url)
    assert code == 0 and out.startswith("nothing to sweep: no live attempt opened before ")

    execute(pg_url, "UPDATE eos.attempts SET opened_at = now() - interval '3 hours'")
    code, out, _ = run("sweep", "--older-than", "2h", "--postgres-url", pg_url, "--dry-run")
    assert code == 0 and out.startswith("would abort 1 attempt(s) opened before ")
    [row] = lines_with(out, PIPELINE)
    assert row.split() == [PIPELINE, "2024-01-01", "02:00:00", "2024-01-01", "03:00:00", "2", stale.staging,
                           "(no", "claim;", "as", "postgresql:eos.windows)"]  # planned without its target
    assert execute(pg_url, "SELECT state FROM eos.attempts WHERE epoch = 2 AND window_start = %s",
                   (stale.window_start,)) == [("open",)]

    code, out, _ = run("sweep", "--older-than", "1h30m", "--postgres-url", pg_url, "--table", "orders")
    assert code == 0 and out.startswith("aborted 1 attempt(s) opened before ")
    assert lines_with(out, PIPELINE, stale.staging)
    assert execute(pg_url, "SELECT state, reason FROM eos.attempts WHERE epoch = 2 AND window_start = %s",
                   (stale.window_start,)) == [("aborted", "swept: live for longer than 1:30:00")]
    assert execute(pg_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'eos_staging'") == [(0,)]
    assert run("sweep", "--older-than", "1h", "--postgres-url", pg_url)[1].startswith("nothing to sweep")


@pytest.mark.parametrize("text, expected", [
    ("45s", timedelta(seconds=45)), ("30m", timedelta(minutes=30)), ("2h", timedelta(hours=2)),
    ("1d", timedelta(days=1)), ("1h30m", timedelta(hours=1, minutes=30)),
])
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "30", "5x", "m30", "0m", "1h 30m", "-5m"])
def test_bad_durations_are_usage_errors(text, capsys):
    assert main(["sweep", "--older-than", text, "--postgres-url", "postgresql://unused"]) == 2
    assert "--older-than" in capsys.readouterr().err


# --------------------------------------------------------------------------- release


def test_release_forgets_a_pipelines_claim_so_that_its_next_plan_claims_it_again(pg_url, kafka_config, committed):
    """The DAG of a pipeline renamed on purpose: refused until the claim is released."""
    from airflow_eos.core.errors import OwnershipConflict
    from airflow_eos.core.ledger import Ledger
    from airflow_eos.core.plan import PlanRequest, plan_window

    def plan(dag_id):
        with KafkaLog(kafka_config) as log_:
            return plan_window(Ledger(pg_url), log_, PlanRequest(committed.plans[0].window, (committed.topic,),
                                                                 dag_id=dag_id))

    plan("orders_v1")  # fills in the DAG of the claim the windows' plans made
    code, out, _ = run("status", "--pipeline", PIPELINE, "--postgres-url", pg_url)
    assert code == 0 and out.splitlines()[1] == f"claimed by DAG 'orders_v1'; topics {committed.topic}"
    with pytest.raises(OwnershipConflict, match="DAG 'orders_v1'.* claimed it first, and DAG 'orders_v2'"):
        plan("orders_v2")

    code, out, err = run("release", "--pipeline", PIPELINE, "--postgres-url", pg_url)
    assert (code, err) == (0, "")
    assert out == (f"released pipeline '{PIPELINE}' (DAG 'orders_v1'; topics {committed.topic}); "
                   f"the next plan of pipeline '{PIPELINE}' claims it again\n")
    assert run("status", "--pipeline", PIPELINE, "--postgres-url", pg_url)[1].splitlines()[1] == \
        "not claimed yet: its next plan claims it"
    assert run("release", "--pipeline", PIPELINE, "--postgres-url", pg_url)[1] == \
        f"pipeline '{PIPELINE}' has no claim to release; its next plan claims it\n"
    assert plan("orders_v2") == committed.plans[0]  # the frozen window, now planned by the renamed DAG

    code, out, err = run("release", "--pipeline", "nope", "--postgres-url", pg_url)
    assert (code, out) == (2, "")
    assert err.startswith("airflow-eos release: error: pipeline 'nope' is not in the ledger of ") and \
        err.rstrip().endswith(f"; it knows: {PIPELINE}")


# --------------------------------------------------------------------------- the installed script


def test_console_script_runs_without_airflow(pg_url, kafka_config, committed):
    env = {"PATH": "/usr/bin:/bin", "EOS_POSTGRES_URL": pg_url}
    done = subprocess.run([str(SCRIPT), "verify", "--pipeline", PIPELINE, "--table", "orders",
                           "--kafka-bootstrap", kafka_config["bootstrap.servers"]],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CLEAN: every record of 2 committed window(s)" in done.stdout

    execute(pg_url, 'UPDATE eos.partition_offsets SET "offset" = 0')
    done = subprocess.run([str(SCRIPT), "verify", "--pipeline", PIPELINE, "--table", "orders",
                           "--kafka-bootstrap", kafka_config["bootstrap.servers"]],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and "VIOLATIONS: 2" in done.stdout

    done = subprocess.run([sys.executable, "-c", "import sys, airflow_eos.cli, airflow_eos.verify;"
                                                 " print(sorted(m for m in sys.modules if m.split('.')[0] == 'airflow'))"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


# --------------------------------------------------------------------------- no secret in any output


def _url_forms(pg_url):
    """The test database under each URL form, with a password the server (trust
    auth) ignores; then forms that cannot connect: malformed, and a closed port."""
    host_port, db = pg_url.split("@", 1)[1].split("/", 1)
    host, port = host_port.split(":")
    closed = free_port()
    return {
        "libpq URL": f"postgresql://postgres:{PASSWORD}@{host}:{port}/{db}",
        "SQLAlchemy psycopg2": f"postgresql+psycopg2://postgres:{PASSWORD}@{host}:{port}/{db}",
        "SQLAlchemy psycopg": f"postgresql+psycopg://postgres:{PASSWORD}@{host}:{port}/{db}",
        "JDBC": f"jdbc:postgresql://{host}:{port}/{db}?user=postgres&password={PASSWORD}",
        "query password": f"postgresql://postgres@{host}:{port}/{db}?password={PASSWORD}",
        "conninfo": f"host={host} port={port} dbname={db} user=postgres password='{PASSWORD}'",
        "malformed conninfo": f"host={host} port={port} password='{PASSWORD}' dbname",
        "malformed query": f"postgresql://postgres:{PASSWORD}@{host}:{port}/{db}?sslpassword={PASSWORD}&bogus=1",
        "JDBC with JDBC-only parameters": f"jdbc:postgresql://{host}:{port}/{db}?password={PASSWORD}&ssl=true",
        "closed port": f"postgresql://postgres:{PASSWORD}@{host}:{closed}/{db}",
        "closed port, conninfo": f"host={host} port={closed} dbname={db} password={PASSWORD}",
    }


FORMS = ["libpq URL", "SQLAlchemy psycopg2", "SQLAlchemy psycopg", "JDBC", "query password", "conninfo",
         "malformed conninfo", "malformed query", "JDBC with JDBC-only parameters", "closed port",
         "closed port, conninfo"]


@pytest.mark.parametrize("form", FORMS)
def test_no_password_in_any_output_whatever_the_url_form(pg_url, kafka_config, form, caplog):
    """status, verify and sweep (on a database without a ledger), then
    Ledger.connect and Ledger.migrate, with the URL in each form: the forms
    that point at the server work (a SQLAlchemy or JDBC URL is normalised), the
    others fail in words; no piece of the password appears in any output,
    exception (with its chain), repr or log record."""
    import logging
    import traceback

    from airflow_eos.core.errors import ConfigurationError, LedgerUnavailable
    from airflow_eos.core.ledger import Ledger
    from airflow_eos.core.migrations import LATEST_VERSION

    url = _url_forms(pg_url)[form]
    reachable = form in FORMS[:6]
    caplog.set_level(logging.DEBUG)
    bootstrap = ["--kafka-bootstrap", kafka_config["bootstrap.servers"]]
    for argv in (["status", "--pipeline", PIPELINE, *bootstrap], ["verify", "--pipeline", PIPELINE,
                 "--table", "orders", *bootstrap], ["sweep", "--older-than", "1h"]):
        code, out, err = run(*argv, "--postgres-url", url, "-v")
        assert code == 2 and out == "", (argv, out, err)
        assert leaked(out + err) == [], err
        if reachable:
            assert "schema eos is missing" in err, err
        elif "closed port" in form:
            assert "cannot connect to the ledger database" in err, err
        else:
            assert "give a libpq URL like postgresql://alice:***@db.example:5432/orders" in err, err  # which form

    ledger = Ledger(url)
    assert leaked(repr(ledger)) == []

    def connect_and_read():
        with ledger.connect() as conn:
            return conn.execute("SELECT max(version) FROM eos.schema_version").fetchone()[0]

    for step in (ledger.migrate, connect_and_read):
        try:
            assert step() == LATEST_VERSION and reachable
        except (ConfigurationError, LedgerUnavailable) as exc:
            assert not reachable, exc
            assert leaked("".join(traceback.format_exception(exc))) == []
            assert exc.__cause__ is None and exc.__context__ is None  # the driver's text is not chained
    assert leaked(caplog.text) == [] and leaked(" ".join(str(r.args) for r in caplog.records)) == []


def test_sweep_on_a_database_without_a_ledger_explains(pg_url):
    code, out, err = run("sweep", "--older-than", "1h", "--postgres-url", pg_url)
    assert (code, out) == (2, "")
    assert err.strip() == f"airflow-eos sweep: error: no airflow-eos ledger in {pg_url}: schema eos is missing"
    code, out, err = run("sweep", "--older-than", "1h", "--postgres-url", pg_url, "--dry-run")
    assert (code, out) == (2, "") and "schema eos is missing" in err


def test_status_and_release_on_a_database_without_a_ledger_explain(pg_url):
    for command in ("status", "release"):
        code, out, err = run(command, "--pipeline", PIPELINE, "--postgres-url", pg_url)
        assert (code, out) == (2, "")
        assert err.strip() == f"airflow-eos {command}: error: no airflow-eos ledger in {pg_url}: schema eos is missing"


def test_an_unreachable_broker_is_one_clear_error_naming_it(pg_url, committed, caplog, capfd):
    """status and verify against a closed port: exit 2 with one error that names
    the address, the partition and what to check; never "offset -2" (the
    beginning of the log); a handful of librdkafka records, none on stderr."""
    import logging

    caplog.set_level(logging.INFO)
    address = f"127.0.0.1:{free_port()}"
    for argv in (["status", "--pipeline", PIPELINE], ["verify", "--pipeline", PIPELINE, "--table", "orders"]):
        caplog.clear()
        code, out, err = run(*argv, "--postgres-url", pg_url, "--kafka-bootstrap", address, "--kafka-timeout", "2")
        assert code == 2, out + err
        [line] = err.splitlines()
        assert f"Kafka at {address}" in line and f"check that bootstrap.servers ({address}) is right" in line, line
        assert "offset -2" not in line
        if argv[0] == "verify":
            assert f"reading {committed.topic}[0] from the beginning of the log within 2.0s" in line, line
        librdkafka = [r for r in caplog.records if r.name == "airflow_eos.librdkafka"]
        assert len(librdkafka) < 10, [r.getMessage() for r in librdkafka]
        # librdkafka's own lines name the client's broker, and the CLI's clients know only `address`; a client
        # another test of this process leaked may still log about its own broker here (seen once in CI: a
        # transactional producer of the session's broker), which says nothing of the CLI
        spilled = [line for line in capfd.readouterr().err.splitlines() if "rdkafka" in line and address in line]
        assert spilled == [], spilled


def test_the_product_cli_has_no_bench(capsys):
    """`make bench` runs the repository's bench/run.py; the installed CLI has no
    benchmark command (a wheel has no bench/) (issue 17)."""
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out
    for command in ("status", "verify", "sweep", "release", "demo"):
        assert f"    {command} " in listed, listed
    assert "bench" not in listed
    assert main(["bench"]) == 2
    assert "invalid choice: 'bench'" in capsys.readouterr().err


def test_the_demo_does_not_import_the_cli():
    """The CLI's `demo` subcommand imports the demo; the demo runs `airflow-eos
    verify` and `status` in subprocesses instead of importing the CLI: no import
    cycle, counting imports inside functions (issue 17)."""
    import ast

    import airflow_eos.demo

    tree = ast.parse(Path(airflow_eos.demo.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {name for name in imported if name and name.startswith("airflow_eos.cli")}, imported
    assert "from airflow_eos import cli" not in Path(airflow_eos.demo.__file__).read_text()


# --------------------------------------------------------------------------- Airflow connections, -o json


def _airflow_env(tmp_path, **connections):
    """The environment of a user's shell where the DAG works: Airflow
    connections (JSON, with a password the trust-auth server ignores), no
    EOS_* variables, not Airflow's unit-test mode."""
    import json
    import os

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EOS_", "AIRFLOW_CONN_", "AIRFLOW__CORE__UNIT_TEST"))}
    env["AIRFLOW_HOME"] = str(tmp_path)
    env.update({f"AIRFLOW_CONN_{name.upper()}": json.dumps(value) for name, value in connections.items()})
    return env


def _pg_connection(pg_url):
    host_port, db = pg_url.split("@", 1)[1].split("/", 1)
    host, port = host_port.split(":")
    return {"conn_type": "postgres", "host": host, "port": int(port), "login": "postgres", "password": PASSWORD,
            "schema": db}


def _script(env, *argv):
    done = subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=300, env=env)
    assert leaked(done.stdout + done.stderr) == [], done.stdout + done.stderr
    return done


@pytest.fixture
def claimed(pg_url, kafka_config, committed, orders):
    """The windows' claim names their target, as the DAG's plan records it."""
    from airflow_eos.core.ledger import Ledger
    from airflow_eos.core.plan import PlanRequest, plan_window

    with KafkaLog(kafka_config) as log_:
        plan_window(Ledger(pg_url), log_, PlanRequest(committed.plans[0].window, (committed.topic,),
                                                      dag_id="orders_hourly", target_id=orders.target_id))
    assert execute(pg_url, "SELECT target FROM eos.pipelines") == [("postgresql:public.orders",)]
    return committed


def test_verify_with_the_dags_connections_and_the_target_the_ledger_records(pg_url, kafka_config, claimed,
                                                                           tmp_path):
    """`airflow-eos verify --pipeline orders_hourly` where the DAG works: the
    default Airflow connections (AIRFLOW_CONN_*), the target read from the
    ledger; -o json is the only thing on stdout; exit 0 clean, 1 on a missing
    row (found by lineage), no password anywhere."""
    import json

    env = _airflow_env(tmp_path, postgres_default=_pg_connection(pg_url),
                       kafka_default={"conn_type": "kafka", "extra": kafka_config})
    done = _script(env, "verify", "--pipeline", PIPELINE, "-o", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert list(report) == ["pipeline", "target", "lineage", "clean", "seconds", "committed_windows", "totals",
                            "windows", "offsets", "not_checkable", "violations"]
    assert report["not_checkable"] == []
    assert (report["pipeline"], report["target"], report["lineage"], report["clean"]) == \
        (PIPELINE, "public.orders", True, True)
    assert report["totals"] == {"kafka_records": 12, "published_rows": 12, "dead_letters": 0, "duplicates": 0,
                                "missing": 0, "extra": 0}
    assert [(w["start"], w["state"], w["kafka_records"], w["published_rows"], w["result"])
            for w in report["windows"]] == [
        ("2024-01-01T00:00:00+00:00", "committed", 6, 6, "ok"), ("2024-01-01T01:00:00+00:00", "committed", 6, 6, "ok"),
        ("2024-01-01T02:00:00+00:00", "planned", None, 0, None)]
    ends = {r.partition: r.end_offset for r in claimed.plans[1].ranges}
    assert report["offsets"] == {
        "recorded": [{"topic": claimed.topic, "partition": p, "offset": ends[p]} for p in (0, 1)],
        "expected": [{"topic": claimed.topic, "partition": p, "offset": ends[p]} for p in (0, 1)], "match": True}
    assert report["violations"] == []


def _in_process(monkeypatch, tmp_path, *argv, **connections):
    """main() with these Airflow connections (AIRFLOW_CONN_*) and no EOS_*
    variables; Airflow is imported once per test process, so this is the
    cheap way to run many cases. No password in any output."""
    import json

    for name in [k for k in __import__("os").environ if k.startswith(("EOS_", "AIRFLOW_CONN_"))]:
        monkeypatch.delenv(name)
    for name, value in connections.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{name.upper()}", json.dumps(value))
    code, out, err = run(*argv)
    assert leaked(out + err) == [], out + err
    return code, out, err


def test_verify_finds_a_missing_row_through_named_connections(pg_url, kafka_config, claimed, tmp_path, monkeypatch):
    """Named Airflow connections, the target from the ledger: exit 1 on a
    missing row (found by lineage) in JSON and in the table; connections that
    cannot be reached or read: exit 2 in words; no password anywhere (a
    PostgreSQL password, a Kafka sasl.password)."""
    import json

    connections = {"eos_pg": _pg_connection(pg_url), "eos_kafka": {"conn_type": "kafka", "extra": kafka_config}}
    offset = claimed.records(claimed.plans[1], 0)[0]
    execute(pg_url, "DELETE FROM orders WHERE eos_partition = 0 AND eos_offset = %s", (offset,))
    by_ids = ["--postgres-conn-id", "eos_pg", "--kafka-conn-id", "eos_kafka"]
    code, out, err = _in_process(monkeypatch, tmp_path, "verify", "--pipeline", PIPELINE, *by_ids, "-o", "json",
                                 **connections)
    assert (code, err) == (1, ""), out + err
    report = json.loads(out)
    assert report["clean"] is False and report["totals"]["missing"] == 1
    assert [(v["kind"], v["window_start"], v["topic"], v["partition"], v["offset"])
            for v in report["violations"] if v["kind"] == "missing"] == [
        ("missing", "2024-01-01T01:00:00+00:00", claimed.topic, 0, offset)]
    assert [w["result"] for w in report["windows"]] == ["ok", "violation", None]
    code, out, err = _in_process(monkeypatch, tmp_path, "verify", "--pipeline", PIPELINE, *by_ids, **connections)
    assert code == 1 and "VIOLATIONS: 2" in out, out + err
    assert out.startswith(f"verify {PIPELINE} against public.orders (record lineage)")

    closed = {**_pg_connection(pg_url), "port": free_port()}
    sasl = {"conn_type": "kafka", "extra": {"bootstrap.servers": f"127.0.0.1:{free_port()}", "security.protocol":
                                            "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN", "sasl.username": "u",
                                            "sasl.password": PASSWORD}}
    code, out, err = _in_process(monkeypatch, tmp_path, "status", "--pipeline", PIPELINE, "--postgres-conn-id",
                                 "down", down=closed)
    assert (code, out) == (2, "") and "cannot connect to the ledger database" in err, err
    code, out, err = _in_process(monkeypatch, tmp_path, "verify", "--pipeline", PIPELINE, "--postgres-conn-id",
                                 "eos_pg", "--kafka-conn-id", "sasl", "--kafka-timeout", "2", "-o", "json",
                                 sasl=sasl, **connections)
    assert (code, out) == (2, "") and "check that bootstrap.servers" in err, err
    code, out, err = _in_process(monkeypatch, tmp_path, "status", "--pipeline", PIPELINE, "--postgres-conn-id",
                                 "nope", **connections)
    assert (code, out) == (2, "")
    assert err.strip() == ("airflow-eos status: error: --postgres-conn-id Airflow connection 'nope' (postgres) "
                           "cannot be read: The conn_id `nope` isn't defined; define it (e.g. AIRFLOW_CONN_NOPE, "
                           "or in a secrets backend Airflow is configured with) or pass a URL")


def test_status_json_through_a_secrets_backend(pg_url, kafka_config, claimed, tmp_path):
    """The connections from a configured secrets backend (Airflow's local
    filesystem backend), as the operators would read them; -o json's keys."""
    import json

    secrets = tmp_path / "connections.json"
    secrets.write_text(json.dumps({"ledger_db": _pg_connection(pg_url),
                                   "cluster": {"conn_type": "kafka", "extra": kafka_config}}))
    env = _airflow_env(tmp_path)
    env["AIRFLOW__SECRETS__BACKEND"] = "airflow.secrets.local_filesystem.LocalFilesystemBackend"
    env["AIRFLOW__SECRETS__BACKEND_KWARGS"] = json.dumps({"connections_file_path": str(secrets)})
    done = _script(env, "status", "--pipeline", PIPELINE, "--postgres-conn-id", "ledger_db", "--kafka-conn-id",
                   "cluster", "-o", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    status = json.loads(done.stdout)
    assert list(status) == ["pipeline", "claim", "windows_by_state", "windows", "kafka", "partitions"]
    assert status["claim"] == {"dag_id": "orders_hourly", "topics": [claimed.topic],
                               "target": "postgresql:public.orders", "target_exclusive": False}
    assert status["windows_by_state"] == {"committed": 2, "planned": 1}
    assert status["windows"][0] == {
        "start": "2024-01-01T00:00:00+00:00", "end": "2024-01-01T01:00:00+00:00", "state": "committed", "epoch": 1,
        "attempts": {"committed": 1}, "published_rows": 6, "dead_letter_rows": 0,
        "committed_at": status["windows"][0]["committed_at"]}
    assert status["windows"][2]["attempts"] == {"open": 1, "aborted": 1}
    with KafkaLog(kafka_config) as log_:
        ends = {p: log_.bounds(TopicPartition(claimed.topic, p)).end for p in (0, 1)}
    committed_at = {r.partition: r.end_offset for r in claimed.plans[1].ranges}
    assert status["kafka"] is True and status["partitions"] == [
        {"topic": claimed.topic, "partition": p, "committed_offset": committed_at[p], "end_of_log": ends[p],
         "lag": ends[p] - committed_at[p]} for p in (0, 1)]


def test_sweep_through_airflow_connections_names_a_kafka_target_it_cannot_reach(pg_url, kafka_config, claimed,
                                                                                tmp_path, monkeypatch):
    """sweep with the ledger's Airflow connection: the claimed PostgreSQL
    target's zombie is aborted by its own sink; a Kafka target whose Airflow
    connection is not defined is named as not swept, saying why."""
    execute(pg_url, "INSERT INTO eos.pipelines (pipeline, topics, target, claimed_at) "
                    "VALUES ('to_topic', ARRAY['orders'], 'kafka:nowhere/curated', now())")
    execute(pg_url, "UPDATE eos.attempts SET opened_at = now() - interval '3 hours'")
    code, out, err = _in_process(monkeypatch, tmp_path, "sweep", "--older-than", "2h", "--postgres-conn-id",
                                 "eos_pg", eos_pg=_pg_connection(pg_url))
    assert (code, err) == (0, ""), out + err
    lines = out.splitlines()
    assert lines[0] == ("not swept: target kafka:nowhere/curated (a Kafka target's cluster Airflow connection "
                        "'nowhere' (kafka) cannot be read: The conn_id `nowhere` isn't defined; define it (e.g. "
                        "AIRFLOW_CONN_NOWHERE, or in a secrets backend Airflow is configured with) or pass a URL)")
    assert lines[1].startswith("aborted 1 attempt(s) opened before ")
    [row] = lines_with(out, PIPELINE, claimed.open_attempt.staging)
    assert row.split()[-1] == "postgresql:public.orders"  # swept by the claimed table's sink
    assert execute(pg_url, "SELECT state FROM eos.attempts WHERE epoch = 2 AND window_start = %s",
                   (claimed.open_attempt.window_start,)) == [("aborted",)]


def test_an_unreachable_broker_is_exactly_one_stderr_line_from_the_console_script(pg_url, committed):
    """As a user runs it (a process of its own, Python's default logging): exit 2,
    one line on stderr, nothing on stdout; no raw librdkafka line (issue 33)."""
    import os

    address = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EOS_")}
    for argv in (["status", "--pipeline", PIPELINE], ["verify", "--pipeline", PIPELINE, "--table", "orders"]):
        done = subprocess.run([str(SCRIPT), *argv, "--postgres-url", pg_url, "--kafka-bootstrap", address,
                               "--kafka-timeout", "2"], capture_output=True, text=True, timeout=120, env=env)
        assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert f"Kafka at {address}" in done.stderr and "rdkafka" not in done.stderr, done.stderr
    verbose = subprocess.run([str(SCRIPT), "status", "--pipeline", PIPELINE, "-v", "--postgres-url", pg_url,
                              "--kafka-bootstrap", address, "--kafka-timeout", "2"],
                             capture_output=True, text=True, timeout=120, env=env)
    assert verbose.returncode == 2 and "airflow_eos.librdkafka" in verbose.stderr  # -v: the clients' log too


def test_verify_refuses_a_target_the_pipeline_is_not_claimed_for_and_names_a_file_root_with_path(
        pg_url, kafka_config, ledger, tmp_path):
    """A pipeline claimed for a file root: --topic / --table naming another target
    is refused with one line naming the claimed one (not 30 false "missing");
    --path names a file target, also after `release` (issue 33)."""
    from airflow_eos.targets.files import FileTarget

    root = tmp_path / "lake"
    root.mkdir()
    sink = FileTarget(path=str(root), ledger_url=pg_url).sink()
    build(ledger, kafka_config, sink)
    execute(pg_url, "UPDATE eos.pipelines SET target = %s", (sink.target_id,))  # as the DAG's first plan claims it
    flags = ["--pipeline", PIPELINE, "--postgres-url", pg_url, "--kafka-bootstrap", kafka_config["bootstrap.servers"]]
    for other in (["--topic", "other"], ["--table", "orders"], ["--path", str(tmp_path / "elsewhere")]):
        code, out, err = run("verify", *flags, *other)
        assert (code, out) == (2, ""), out + err
        [line] = err.splitlines()
        assert f"pipeline {PIPELINE!r} is claimed for target {sink.target_id}, not " in line, line
        assert "release" in line and "missing" not in line

    for named in ([], ["--path", str(root)], ["--path", f"file://{root}/"]):
        code, out, err = run("verify", *flags, *named)
        assert (code, err) == (0, ""), out + err
        assert "CLEAN: every record of 3 committed window(s)" in out and str(root) in out.splitlines()[0]

    assert run("release", "--pipeline", PIPELINE, "--postgres-url", pg_url)[0] == 0
    code, out, err = run("verify", *flags)
    assert code == 2 and "--path (a file target's root)" in err, err
    code, out, err = run("verify", *flags, "--path", str(root))
    assert (code, err) == (0, "") and "CLEAN" in out, out + err
