"""Bad input (issue 22 part 5) that no other test covered through the steps:
wrong credentials for each connection, invalid connection extras, an unknown
or recreated source topic, unicode and hostile identifiers end to end.

Each test runs real services (PostgreSQL, Apache Kafka)
and the production steps (harness.chaos: airflow_eos.steps with the Spark
job's Python stand-in), commits some windows first, then gives the bad input
and asserts: the error says what is wrong, where, and what to do; no secret
in it, nor in the captured logs and output; nothing of the bad window was
planned, staged or published; the committed windows are intact (verify
against Kafka by lineage, or, when the source is gone, the target unchanged).
docs/guarantees.md's "Bad input" table maps every class to its test.
"""

from __future__ import annotations

import json
import time
import uuid

import psycopg
import pytest
from psycopg import sql

from airflow_eos.core.errors import ConfigurationError, LedgerUnavailable, LogTruncated, SourceUnavailable, UnknownTopic
from airflow_eos.core.ledger import Ledger
from airflow_eos.embedded import PostgresServer
from harness import chaos
from harness.leaks import PASSWORD, leaked
from harness.topics import create_topic, delete_topic

HOURS = 3  # windows in the source topic
PER_HOUR = 3
PARTITIONS = 2


def source_topic(bootstrap: str) -> str:
    topic = f"bad-{uuid.uuid4().hex[:8]}"
    chaos.create_topic(bootstrap, topic, PARTITIONS)
    chaos.produce(bootstrap, topic, chaos.source_records(HOURS, PER_HOUR, PARTITIONS))
    return topic


def pipeline(url: str, bootstrap: str, topic: str, *, name: str | None = None, table: str | None = None,
             **kafka) -> chaos.Pipeline:
    name = name or f"bad_{uuid.uuid4().hex[:6]}"
    table = table or f"chaos.{name}"
    chaos.create_target_table(url, table)
    return chaos.Pipeline(name, url, table, {"bootstrap.servers": bootstrap, "fetch.wait.max.ms": 10, **kafka},
                          (topic,))


def committed(p: chaos.Pipeline, tmp_path, windows=(0, 1)) -> chaos.Harness:
    """Windows ``windows`` of ``p`` run and committed (checked)."""
    h = chaos.Harness(p, tmp_path / p.name)
    for i in windows:
        assert h.run(i).state == "success", h.history()
    chaos.check(h, windows)
    return h


def ledger_state(url: str, name: str) -> tuple:
    """Everything the ledger holds for pipeline ``name``: windows, attempts, offsets."""
    with psycopg.connect(url) as conn:
        return tuple(conn.execute(q, (name,)).fetchall() for q in (
            "SELECT window_start, state, epoch, committed_epoch FROM eos.windows WHERE pipeline = %s ORDER BY 1",
            "SELECT window_start, epoch, state FROM eos.attempts WHERE pipeline = %s ORDER BY 1, 2",
            'SELECT topic, partition, "offset" FROM eos.partition_offsets WHERE pipeline = %s ORDER BY 1, 2'))


def target_rows(url: str, table: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql.SQL("SELECT eos_topic, eos_partition, eos_offset, id, amount FROM {} ORDER BY 1, 2, 3")
                            .format(sql.SQL(table))).fetchall()


def no_secret(secret: str, *texts: str) -> None:
    for text in texts:
        assert not leaked(text, secret), f"the secret leaked: {leaked(text, secret)} in {text[:2000]!r}"


# --------------------------------------------------------------------------- credentials


@pytest.fixture
def guarded_pg():
    """A PostgreSQL server of its own that checks passwords (scram-sha-256 for
    TCP logins but the superuser's): role ``eos``, password ``right-password``,
    owner of database ``eosdb`` (ledger migrated)."""
    with PostgresServer() as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE ROLE eos LOGIN PASSWORD 'right-password'")
            conn.execute("CREATE DATABASE eosdb OWNER eos")
        (server.data / "pg_hba.conf").write_text(
            "local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
        server._run("pg_ctl", "-D", str(server.data), "reload")
        url = f"postgresql://eos:right-password@127.0.0.1:{server.port}/eosdb"
        for _ in range(50):  # the reload is asynchronous
            try:
                psycopg.connect(url.replace("right-password", "x"), connect_timeout=2).close()
            except psycopg.OperationalError:
                break
            time.sleep(0.1)
        Ledger(url).migrate()
        yield server, url


def test_wrong_postgres_password_fails_clearly_without_the_password_and_publishes_nothing(
        guarded_pg, kafka, tmp_path, monkeypatch, caplog, capfd):
    """The ledger's connection with a wrong password, as an Airflow connection
    resolved by the hook: the plan and the commit both fail naming the server,
    database and user and saying what to check; the password is nowhere (error,
    logs, output); the window stays unpublished, the committed ones intact."""
    from airflow_eos.hooks.eos import EosPostgresHook

    server, url = guarded_pg
    p = pipeline(url, kafka.address, source_topic(kafka.address))
    h = committed(p, tmp_path)
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_WRONG", json.dumps({
        "conn_type": "postgres", "host": "127.0.0.1", "port": server.port, "login": "eos", "password": PASSWORD,
        "schema": "eosdb"}))
    wrong = chaos.Pipeline(p.name, EosPostgresHook(postgres_conn_id="ledger_wrong").ledger_url, p.table,
                           p.kafka_config, p.topics)
    before = ledger_state(url, p.name), target_rows(url, p.table)

    with pytest.raises(LedgerUnavailable) as planning:
        chaos.plan_step(wrong, wrong.window(2))
    staged = chaos.stage_step(p, chaos.plan_step(p, p.window(2)))  # the stage ran with the right one
    chaos.await_step(p, staged)
    with pytest.raises(LedgerUnavailable) as committing:
        chaos.commit_step(wrong, staged)

    for caught in (planning, committing):
        message = str(caught.value)
        assert f"cannot connect to the ledger database host=127.0.0.1 port={server.port} user=eos password=***" \
               in message, message
        assert 'password authentication failed for user "eos"' in message  # what
        assert "check the login, password and database of the PostgreSQL connection" in message  # what to do
        assert caught.value.__cause__ is None  # the driver's exception holds the unredacted conninfo
    out, err = capfd.readouterr()
    no_secret(PASSWORD, str(planning.value), str(committing.value), caplog.text, out, err)
    after = ledger_state(url, p.name)
    assert after[0][:2] == before[0][0] and after[0][2][1] == "planned"  # window 2 planned, not committed
    assert [s for w, _, s in after[1] if w == p.window(2).start] == ["prepared"]
    assert after[2] == before[0][2] and target_rows(url, p.table) == before[1]  # no offset moved, no row
    chaos.abort_step(p, p.window(2))  # the teardown, with the right connection
    chaos.check(h, (0, 1))


def says_the_broker_refused(message: str, address: str, topic: str, reason: str) -> None:
    """The error of a client the broker would not talk to: where, what, what to do."""
    assert f"Kafka at {address} did not answer for topic '{topic}'" in message, message  # where
    assert reason in message, message  # what: the client's own reason
    assert "and the security settings" in message  # what to do


def test_wrong_kafka_credentials_fail_clearly_without_the_password_and_plan_nothing(
        pg_url, ledger, kafka, tmp_path, caplog, capfd):
    """SASL credentials the broker refuses: the plan fails naming the cluster,
    the client's reason and what to check; the password is nowhere; nothing is
    frozen for the window; the committed windows verify clean."""
    p = pipeline(pg_url, kafka.address, source_topic(kafka.address))
    h = committed(p, tmp_path)
    sasl = chaos.Pipeline(p.name, p.url, p.table, {**p.kafka_config, "security.protocol": "SASL_PLAINTEXT",
                                                   "sasl.mechanism": "PLAIN", "sasl.username": "eos",
                                                   "sasl.password": PASSWORD}, p.topics)
    before = ledger_state(pg_url, p.name)

    with pytest.raises(SourceUnavailable) as caught:
        chaos.plan_step(sasl, sasl.window(2))

    message = str(caught.value)
    says_the_broker_refused(message, kafka.address, p.topics[0], "SASL")
    out, err = capfd.readouterr()
    no_secret(PASSWORD, message, caplog.text, out, err)
    assert ledger_state(pg_url, p.name) == before
    chaos.check(h, (0, 1))


def test_wrong_tls_settings_fail_clearly_without_the_key_password_and_plan_nothing(
        pg_url, ledger, kafka, tmp_path, caplog, capfd):
    """TLS spoken to the broker's plaintext listener: the plan fails naming the
    broker, the client's reason and what to check; a CA file that does not
    exist: a terminal error naming the setting. The key's password is nowhere;
    nothing is frozen for the window; the committed windows verify clean."""
    p = pipeline(pg_url, kafka.address, source_topic(kafka.address))
    h = committed(p, tmp_path)
    before = ledger_state(pg_url, p.name)
    tls = {**p.kafka_config, "security.protocol": "SSL", "ssl.key.password": PASSWORD,
           "socket.timeout.ms": 3000}
    ssl = chaos.Pipeline(p.name, p.url, p.table, tls, p.topics)
    with pytest.raises(SourceUnavailable) as caught:
        chaos.plan_step(ssl, ssl.window(2))
    message = str(caught.value)
    says_the_broker_refused(message, kafka.address, p.topics[0], "SSL")

    missing_ca = str(tmp_path / "no-such-ca.pem")
    bad_ca = chaos.Pipeline(p.name, p.url, p.table, {**tls, "ssl.ca.location": missing_ca}, p.topics)
    with pytest.raises(ConfigurationError) as caught:
        chaos.plan_step(bad_ca, bad_ca.window(2))
    ca_message = str(caught.value)
    assert ca_message.startswith(f"cannot create Kafka consumer for bootstrap.servers '{kafka.address}': "), ca_message
    assert "ssl.ca.location" in ca_message and missing_ca in ca_message, ca_message
    assert caught.value.terminal
    out, err = capfd.readouterr()
    no_secret(PASSWORD, message, ca_message, caplog.text, out, err)
    assert ledger_state(pg_url, p.name) == before
    chaos.check(h, (0, 1))


# --------------------------------------------------------------------------- connection extras


def test_invalid_connection_extras_fail_clearly_naming_the_setting_and_plan_nothing(
        pg_url, ledger, kafka, tmp_path, monkeypatch, caplog):
    """A Kafka connection whose extra holds a property librdkafka does not know
    (or a secret it refuses), a Postgres connection whose extra holds an invalid
    sslmode: each fails naming the setting and where to fix it, terminally for
    Kafka (a retry cannot help); the secret is nowhere; nothing is planned."""
    from airflow_eos.hooks.eos import EosKafkaHook, EosPostgresHook

    p = pipeline(pg_url, kafka.address, source_topic(kafka.address))
    h = committed(p, tmp_path)
    before = ledger_state(pg_url, p.name)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_TYPO", json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": kafka.address, "fetch.wait.max.msec": 10}}))
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_BAD_SASL", json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": kafka.address, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "NOPE",
        "sasl.password": PASSWORD}}))
    base = psycopg.conninfo.conninfo_to_dict(pg_url)
    monkeypatch.setenv("AIRFLOW_CONN_PG_BAD_EXTRA", json.dumps({
        "conn_type": "postgres", "host": base["host"], "port": int(base["port"]), "login": base["user"],
        "password": PASSWORD, "schema": base["dbname"], "extra": {"sslmode": "bogus"}}))

    for conn_id, setting in (("kafka_typo", '"fetch.wait.max.msec"'), ("kafka_bad_sasl", "SASL mechanism: NOPE")):
        bad = chaos.Pipeline(p.name, p.url, p.table, EosKafkaHook(kafka_config_id=conn_id).kafka_config, p.topics)
        with pytest.raises(ConfigurationError) as caught:
            chaos.plan_step(bad, bad.window(2))
        message = str(caught.value)
        assert message.startswith(f"cannot create Kafka consumer for bootstrap.servers '{kafka.address}': "), message
        assert setting in message  # what
        assert "the Kafka connection's extra" in message and "correct or remove that property there" in message
        assert caught.value.terminal
        no_secret(PASSWORD, message)

    bad_pg = chaos.Pipeline(p.name, EosPostgresHook(postgres_conn_id="pg_bad_extra").ledger_url, p.table,
                            p.kafka_config, p.topics)
    with pytest.raises(LedgerUnavailable) as caught:
        chaos.plan_step(bad_pg, bad_pg.window(2))
    message = str(caught.value)
    assert 'invalid sslmode value: "bogus"' in message and f"port={base['port']}" in message, message
    assert "the connection's other settings (its extra: sslmode" in message
    no_secret(PASSWORD, message, caplog.text)
    assert ledger_state(pg_url, p.name) == before
    chaos.check(h, (0, 1))


# --------------------------------------------------------------------------- the source


def test_an_unknown_topic_plans_nothing_and_says_what_to_check(pg_url, ledger, kafka, tmp_path):
    p = pipeline(pg_url, kafka.address, "no-such-topic-" + uuid.uuid4().hex[:6])
    with pytest.raises(UnknownTopic) as caught:
        chaos.plan_step(p, p.window(0))
    message = str(caught.value)
    assert message.startswith(f"topic '{p.topics[0]}' does not exist on {kafka.address}: "), message
    assert "check the topic names of the pipeline's KafkaSource" in message
    assert "never creates a source topic" in message and "nothing was planned" in message
    assert ledger_state(pg_url, p.name) == ([], [], []) and target_rows(pg_url, p.table) == []
    from confluent_kafka.admin import AdminClient

    assert p.topics[0] not in AdminClient({"bootstrap.servers": kafka.address}).list_topics(timeout=10).topics


def test_a_recreated_topic_fails_the_rerun_loudly_and_keeps_what_was_committed(pg_url, ledger, kafka, tmp_path):
    """Windows 0 and 1 committed; the topic is deleted and recreated with less
    data; a clear of window 1 (frozen plan) and window 2 planned after window
    1's frozen end both fail with LogTruncated saying what to do; the target's
    rows and the ledger's offsets are what they were."""

    topic = source_topic(kafka.address)
    p = pipeline(pg_url, kafka.address, topic)
    committed(p, tmp_path)
    before = ledger_state(pg_url, p.name), target_rows(pg_url, p.table)
    delete_topic(kafka.address, topic)
    create_topic(kafka.address, topic, PARTITIONS)
    chaos.produce(kafka.address, topic, chaos.source_records(1, 1, PARTITIONS))  # 2 records an hour, hour 0 only

    with pytest.raises(LogTruncated) as caught:
        chaos.plan_step(p, p.window(1))
    message = str(caught.value)
    assert f"window {p.window(1)}: {topic}[" in message and "but the log ends at" in message, message  # where, what
    assert "The topic was recreated or lost data since the window was planned" in message
    assert "Nothing of this window was published and the committed windows stay as they are" in message
    assert "Restore the topic's records" in message and "start a new pipeline id" in message  # what to do
    assert caught.value.terminal
    assert ledger_state(pg_url, p.name) == before[0] and target_rows(pg_url, p.table) == before[1]
    assert len(before[1]) > 0


# --------------------------------------------------------------------------- identifiers


def test_unicode_and_hostile_identifiers_run_through_every_step(pg_url, ledger, kafka, tmp_path):
    """A pipeline id and a table (in its own schema) with non-ASCII letters,
    quotes, ``;``, ``%`` and a comment: planned, staged, committed and verified
    like any other; nothing else in the database is touched."""
    schema, table = 'bestellungen_ü "日本"; --', "заказы'); DROP TABLE eos.windows; --%s %(x)s"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    quoted = sql.Identifier(schema, table).as_string(None)
    name = "주문_ü'; DROP TABLE eos.attempts; --\"%s"
    topic = source_topic(kafka.address)
    p = chaos.Pipeline(name, pg_url, quoted, {"bootstrap.servers": kafka.address, "fetch.wait.max.ms": 10}, (topic,))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(chaos.TARGET_DDL.format(table=quoted, partitioned=""))

    h = committed(p, tmp_path, windows=(0, 1, 2))

    rows = target_rows(pg_url, quoted)
    assert len(rows) > 0 and {r[0] for r in rows} == {topic}
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('eos.windows') IS NOT NULL, to_regclass('eos.attempts') IS NOT NULL"
                            ).fetchone() == (True, True)
        assert conn.execute(sql.SQL("SELECT DISTINCT eos_pipeline FROM {}").format(sql.SQL(quoted))).fetchall() \
            == [(name,)]
        assert conn.execute("SELECT count(*) FROM eos.windows WHERE pipeline = %s AND state = 'committed'",
                            (name,)).fetchone()[0] == 3
    assert h.runs == 3
