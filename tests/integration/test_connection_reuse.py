"""A thread reuses the ledger connections it finished with (core.database.reused),
and a reused connection is what a new one would be: nothing of the last
block's session carries over, a dead one is replaced, threads and forked
children never share one. Real PostgreSQL servers."""

from __future__ import annotations

import os
import threading
import time

import psycopg
import pytest

from airflow_eos.core import database
from airflow_eos.core.database import close_idle, reused
from airflow_eos.core.ledger import Ledger
from airflow_eos.embedded import PostgresServer


@pytest.fixture(autouse=True)
def no_idle_connections():
    close_idle()
    yield
    close_idle()


def sessions(url: str, app: str = "airflow-eos ledger") -> list[tuple[int, str]]:
    """(pid, state) of the sessions named ``app`` on url's database."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT pid, state FROM pg_stat_activity WHERE application_name = %s "
                            "AND datname = current_database() ORDER BY pid", (app,)).fetchall()


def after_closing(read, expected):
    """What ``read()`` gives once the backends of connections just closed have
    left pg_stat_activity (a backend leaves a moment after its client closed
    it, later on a loaded machine): read again while it holds more than
    ``expected`` (a count, or sessions), up to a deadline."""
    def more(found) -> bool:
        return found > expected if isinstance(found, int) else set(found) > set(expected)

    deadline = time.monotonic() + 10
    while more(found := read()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_a_reused_connection_carries_nothing_of_the_last_block(pg_url):
    ledger = Ledger(pg_url)
    with ledger.connect() as conn, conn.transaction():
        first = conn.info.backend_pid
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (1)")
    with ledger.connect() as conn:
        assert conn.info.backend_pid == first  # the same session, taken again
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ  # as verify sets it
        conn.execute("INSERT INTO kept VALUES (2)")  # outside a transaction block: not committed
        conn.execute("CREATE TEMP TABLE scratch (x int)")
        conn.execute("SET statement_timeout = '1min'")
        conn.execute("SELECT pg_advisory_lock(42)")
    with ledger.connect() as conn:
        assert conn.info.backend_pid == first
        assert conn.autocommit is False and conn.isolation_level is None
        assert conn.execute("SELECT x FROM kept").fetchall() == [(1,)]  # rolled back, as closing would
        assert conn.execute("SELECT to_regclass('pg_temp.scratch')").fetchone() == (None,)
        assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)
        assert conn.execute("SHOW application_name").fetchone() == ("airflow-eos ledger",)
    with psycopg.connect(pg_url) as other:
        assert other.execute("SELECT pg_try_advisory_lock(42)").fetchone() == (True,)  # released
    # A query psycopg prepares (run 5 times) stays known to both sides across
    # resets (DISCARD ALL made psycopg run one the server had forgotten).
    for i in range(12):
        with ledger.connect() as conn, conn.transaction():
            assert conn.info.backend_pid == first
            assert conn.execute("SELECT x FROM kept WHERE x = %s", (1,)).fetchall() == [(1,)]
            conn.execute("CREATE TEMP TABLE scratch (x int)")
            conn.execute("INSERT INTO scratch VALUES (%s)", (i,))
            assert conn.execute("SELECT x FROM scratch").fetchall() == [(i,)]
    assert sessions(pg_url) == [(first, "idle")]


def test_a_session_is_named_for_what_it_does_and_rests_under_its_purpose(pg_url):
    """pg_stat_activity tells which window a busy session works on, and an idle
    one by the use it is kept for; naming it begins no transaction."""
    from psycopg.pq import TransactionStatus
    for autocommit in (True, False):
        with reused(pg_url, "postgres target", doing="commit w1 e1", autocommit=autocommit) as conn:
            assert conn.info.transaction_status == TransactionStatus.IDLE
            first = conn.info.backend_pid
            assert conn.execute("SHOW application_name").fetchone() == ("airflow-eos commit w1 e1",)
        assert after_closing(lambda: sessions(pg_url, "airflow-eos postgres target"), [(first, "idle")]) == \
            [(first, "idle")]
        with reused(pg_url, "postgres target", doing="prepare w2 e1", autocommit=autocommit) as conn:
            assert conn.info.backend_pid == first and conn.info.transaction_status == TransactionStatus.IDLE
            assert conn.execute("SHOW application_name").fetchone() == ("airflow-eos prepare w2 e1",)
        with reused(pg_url, "postgres target") as conn:
            assert conn.info.backend_pid == first
            assert conn.execute("SHOW application_name").fetchone() == ("airflow-eos postgres target",)
        close_idle()


def test_a_failed_block_rolls_back_and_a_broken_session_is_not_kept(pg_url):
    ledger = Ledger(pg_url)
    with ledger.connect() as conn, conn.transaction():
        conn.execute("CREATE TABLE t (x int PRIMARY KEY)")
        first = conn.info.backend_pid
    with pytest.raises(ValueError), ledger.connect() as conn, conn.transaction():
        conn.execute("INSERT INTO t VALUES (1)")
        raise ValueError("the step failed")
    with pytest.raises(psycopg.errors.UniqueViolation), ledger.connect() as conn:
        conn.execute("INSERT INTO t VALUES (2)")
        conn.execute("INSERT INTO t VALUES (2)")  # the transaction is in error when handed back
    with ledger.connect() as conn:
        assert conn.info.backend_pid == first
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
    with pytest.raises(psycopg.OperationalError), ledger.connect() as conn:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        conn.execute("SELECT 1")
    with ledger.connect() as conn:
        assert conn.info.backend_pid != first
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_a_restarted_server_or_an_ended_idle_session_gets_a_new_connection():
    with PostgresServer() as server:
        ledger = Ledger(server.url)
        with ledger.connect() as conn:
            before = conn.info.backend_pid
        server.restart("fast")  # every idle session of the thread is gone
        with ledger.connect() as conn:
            after = conn.info.backend_pid
            assert after != before and conn.execute("SELECT 1").fetchone() == (1,)
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (after,))  # idle_session_timeout, a DBA
        with ledger.connect() as conn:
            assert conn.info.backend_pid not in (before, after)
        server.stop("fast")
        from airflow_eos.core.errors import LedgerUnavailable
        with pytest.raises(LedgerUnavailable, match="cannot connect to the ledger database"), ledger.connect():
            pass


def test_threads_never_share_and_idle_connections_are_bounded_in_number_and_age(pg_url, monkeypatch):
    held, release = threading.Barrier(3), threading.Event()
    pids: list[int] = []

    def hold():
        with Ledger(pg_url).connect() as conn:
            pids.append(conn.info.backend_pid)
            held.wait(10)
            release.wait(10)

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    held.wait(10)
    with Ledger(pg_url).connect() as conn:
        pids.append(conn.info.backend_pid)
    release.set()
    for t in threads:
        t.join()
    assert len(set(pids)) == 3
    # The threads ended: their idle connections closed with them.
    assert after_closing(lambda: [pid for pid, _ in sessions(pg_url)], [pids[2]]) == [pids[2]]

    def hold_many(n: int) -> None:
        if n:
            with reused(pg_url, f"purpose {n}"):
                hold_many(n - 1)

    close_idle()
    hold_many(database.IDLE_PER_THREAD + 2)  # as many open at once, then handed back

    def kept() -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
                                "'airflow-eos purpose %' AND datname = current_database()").fetchone()[0]

    assert after_closing(kept, database.IDLE_PER_THREAD) == database.IDLE_PER_THREAD

    # This side's age limit alone (as against a server before 14, which cannot
    # end idle sessions itself; the next test covers the server's).
    monkeypatch.setattr(database, "_ends_idle", lambda conn: False)
    monkeypatch.setattr(database, "IDLE_LIMIT_S", 0.0)
    with Ledger(pg_url).connect() as conn:
        old = conn.info.backend_pid
    with Ledger(pg_url).connect() as conn:
        assert conn.info.backend_pid != old  # too old to take: closed
    new = conn.info.backend_pid
    assert after_closing(lambda: [pid for pid, _ in sessions(pg_url)], [new]) == [new]
    close_idle()
    assert after_closing(lambda: sessions(pg_url), []) == []


def test_a_forked_child_neither_uses_nor_ends_its_parents_connections(pg_url):
    ledger = Ledger(pg_url)
    with ledger.connect() as conn:
        parent = conn.info.backend_pid
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            with ledger.connect() as conn:
                os.write(write, str(conn.info.backend_pid).encode())
            close_idle()
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    child_pid = int(os.read(read, 64) or 0)
    os.close(read)
    assert os.waitpid(child, 0)[1] == 0
    assert child_pid not in (0, parent)
    with ledger.connect() as conn:
        assert conn.info.backend_pid == parent  # alive: the child did not end it


def test_the_server_ends_a_kept_connection_its_thread_never_takes_again(pg_url, monkeypatch):
    # A long-lived thread (an API server's, a triggerer's) may open the ledger
    # once and never again: this side would never close what it keeps.
    monkeypatch.setattr(database, "IDLE_LIMIT_S", 1.0)
    with Ledger(pg_url).connect() as conn:
        first = conn.info.backend_pid
        assert conn.execute("SHOW idle_session_timeout").fetchone() == ("0",)  # not while in use
    deadline = time.monotonic() + 15
    while sessions(pg_url):
        assert time.monotonic() < deadline, f"the kept session was never ended: {sessions(pg_url)}"
        time.sleep(0.1)
    monkeypatch.setattr(database, "IDLE_LIMIT_S", 30.0)  # this side still holds it as fresh
    with Ledger(pg_url).connect() as conn:
        assert conn.info.backend_pid != first  # the dead one was found out and replaced, no error
        assert conn.execute("SHOW idle_session_timeout").fetchone() == ("0",)
    with Ledger(pg_url).connect() as conn:
        assert conn.execute("SHOW idle_session_timeout").fetchone() == ("0",)  # taken again: as a new session
