"""What the race tests need: a call running in a thread of its own, calls
released together in threads of their own, and a wait until some of a
database's sessions are blocked on a lock (the moment a race is set up)."""

from __future__ import annotations

import threading
import time

import psycopg


class Background(threading.Thread):
    """Runs ``fn(*args)`` in a daemon thread at once and keeps its result or
    the exception it raised, for the test to look at (outcome())."""

    def __init__(self, fn, *args):
        super().__init__(daemon=True)
        self.fn, self.args, self.result, self.error = fn, args, None, None
        self.start()

    def run(self):
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def outcome(self, timeout: float = 30):
        """(result, exception); fails the test if the call is still running after ``timeout`` s."""
        self.join(timeout)
        assert not self.is_alive(), "background call did not finish"
        return self.result, self.error


def at_once(calls, timeout: float = 120) -> list[tuple[object, BaseException | None]]:
    """Each of ``calls`` in a thread of its own, all released by one barrier:
    (result, exception) of each, in order."""
    barrier = threading.Barrier(len(calls))

    def released(fn):
        barrier.wait()
        return fn()

    running = [Background(released, fn) for fn in calls]
    return [call.outcome(timeout) for call in running]


def blocked_on_locks(url: str, count: int = 1, *, application: str | None = None,
                     timeout: float = 20.0) -> list[int]:
    """PIDs of the sessions of ``url``'s database (those whose application_name
    starts with ``application``, if given) once ``count`` of them wait on a lock."""
    query = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
             " AND application_name LIKE %s ORDER BY pid")
    like = (application or "").replace("%", r"\%").replace("_", r"\_") + "%"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with psycopg.connect(url, autocommit=True) as conn:
            pids = [pid for (pid,) in conn.execute(query, (like,))]
        if len(pids) >= count:
            return pids
        time.sleep(0.02)
    raise AssertionError(f"{count} session(s) of {application or 'any application'} never waited on a lock")
