"""Connecting to the target database (which holds the ledger), and keeping its
password out of every message.

Every connection the package opens goes through :func:`connect` (or
:func:`reused`, which hands a thread back the connections it finished with), and every text
that may hold a connection string — an error, a log line, a ``repr`` — goes
through :func:`redact`. libpq echoes the conninfo it could not parse (``missing
"=" after "postgresql+psycopg2://user:PASSWORD@…"``), so a driver's message is
redacted as well, knowing the URL it was given. :func:`pg_message` gives the
server's own words for an error.

URL forms accepted (see :func:`libpq_url`): libpq URLs (``postgresql://``,
``postgres://``), libpq key=value conninfo, SQLAlchemy URLs as Airflow shows them
(``postgresql+psycopg2://``, ``postgresql+psycopg://``, ...), and
``jdbc:postgresql://host/db?user=u&password=p`` when all its parameters are
libpq ones. A password may hold a raw ``@`` or ``:``: the userinfo ends at the
LAST ``@`` (so an ``@`` in a query value must be percent-encoded, ``%40``).
Percent-encoded characters are decoded, as libpq does.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, quote, unquote

from airflow_eos.core.errors import ConfigurationError, LedgerUnavailable

# psycopg is imported where a connection is made: importing this module (as
# every DAG file does through the target) must not load it.
if TYPE_CHECKING:
    import psycopg

MASK = "***"

# scheme://user:password@ — the password runs to the last "@" of the token
# (greedy), so a raw "@" or ":" inside it is masked too.
_URL_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][\w+.\-]*://[^\s:/@\"'?#]*):(?P<password>[^\s\"']*)@")
# password=... and sslpassword=... in a URL query or in key=value conninfo: a
# quoted value (an unterminated quote runs to the end), else up to whitespace;
# a mask already there stays as it is.
_PASSWORD_PARAM = re.compile(
    r"(?i)(?P<head>(?:ssl)?password\s*=\s*)(?P<value>\*\*\*(?![^\s,;:)'\"])|'(?:[^'\\]|\\.)*(?:'|\Z)|\S+)")
_SQLALCHEMY_SCHEME = re.compile(r"(?i)^postgres(?:ql)?\+[\w.]+://")
_LIBPQ_SCHEME = re.compile(r"(?i)^postgres(?:ql)?://")
# Written as redact() leaves it, so that redacting a message twice keeps it whole.
_FORMS = ("a libpq URL like postgresql://alice:***@db.example:5432/orders (percent-encode special characters of "
          "the password) or a conninfo like 'host=db.example port=5432 dbname=orders user=alice password=***'")
# Shorter secrets are only masked where their syntax shows them: as plain
# strings they would mask unrelated words.
_MIN_LITERAL = 3


def redact(text: str, url: str | None = None) -> str:
    """``text`` with every password of a connection string masked, whatever its
    form (URL userinfo, ``password=``/``sslpassword=`` parameters, quoted or not).

    With ``url`` (the connection string a driver was given), the passwords in it
    are also masked wherever they appear in ``text`` — raw, decoded or encoded —
    for messages that quote a fragment of a string libpq could not parse.
    """
    # Parameters first: a masked "password=***" leaves no "@" for the
    # userinfo pattern to run to.
    text = _PASSWORD_PARAM.sub(lambda m: m["head"] + MASK, str(text))
    text = _URL_USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    for secret in sorted(_secrets(url), key=len, reverse=True) if url else ():
        text = text.replace(secret, MASK)
    return text


def pg_message(exc: psycopg.Error) -> str:
    """The server's words for an error, including where (COPY line and column)
    when it says."""
    diag = exc.diag
    text = diag.message_primary or str(exc)
    extra = [d for d in (diag.message_detail, diag.message_hint, diag.context) if d]
    return text + (" (" + "; ".join(x.strip() for x in extra) + ")" if extra else "")


def _secrets(url: str) -> set[str]:
    """The passwords written in ``url``, in each spelling a message may show."""
    found: list[str] = []
    userinfo = -1 if url.strip()[:5].lower() == "jdbc:" else _userinfo_end(url.partition("://")[2])
    if userinfo > 0:
        user_password = url.partition("://")[2][:userinfo]
        if ":" in user_password:
            found.append(user_password.split(":", 1)[1])
    for m in _PASSWORD_PARAM.finditer(url):
        value = m["value"]
        found.append(value)
        if value.startswith("'"):
            found.append(value.strip("'").replace("\\'", "'").replace("\\\\", "\\"))
        found.extend(value.split("&", 1)[:1])  # a URL query's value ends at "&"
    spellings = set()
    for secret in found:
        decoded = unquote(secret)
        for spelling in (secret, decoded, quote(decoded, safe="")):
            spellings.add(spelling)
            # A parser that split the password at a raw "@" or ":" quotes the
            # pieces on either side (as a user, host or port).
            for cut in (i for i, c in enumerate(spelling) if c in "@:"):
                spellings |= {spelling[:cut], spelling[cut + 1:]}
    return {s for s in spellings if len(s) >= _MIN_LITERAL}


@functools.cache
def _libpq_keywords() -> frozenset[str]:
    import psycopg
    return frozenset(o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults())


def libpq_url(url: str) -> str:
    """The connection string libpq understands for ``url`` (see the module's
    docstring for the forms); raises ConfigurationError, redacted, otherwise."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(f"no database URL given (got {url!r}); give {_FORMS}")
    text = url.strip()
    if text[:5].lower() == "jdbc:":
        text = text[5:]
        if not _LIBPQ_SCHEME.match(text):
            raise ConfigurationError(f"{redact(url)} is a JDBC URL for another database; give {_FORMS}")
        _, _, query = text.partition("?")
        unknown = sorted({k for k, _ in parse_qsl(query, keep_blank_values=True)} - _libpq_keywords())
        if unknown:
            raise ConfigurationError(
                f"{redact(url)}: the JDBC parameter(s) {', '.join(unknown)} have no libpq equivalent here; "
                f"give {_FORMS}, e.g. sslmode=require instead of ssl=true")
        # JDBC has no userinfo: user and password are query parameters, which
        # libpq reads as they are (an "@" in them is no separator).
        return "postgresql://" + text.partition("://")[2]
    text = _SQLALCHEMY_SCHEME.sub("postgresql://", text, count=1)
    if "://" not in text:
        return text  # key=value conninfo: libpq parses it
    if not _LIBPQ_SCHEME.match(text):
        raise ConfigurationError(f"{redact(url)} is not a PostgreSQL URL; give {_FORMS}")
    scheme, _, rest = text.partition("://")
    at = _userinfo_end(rest)
    if at < 0:
        return f"postgresql://{rest}"
    user, colon, password = rest[:at].partition(":")
    userinfo = _encode(user) + (":" + _encode(password) if colon else "")
    return f"postgresql://{userinfo}@{rest[at + 1:]}"


def _userinfo_end(rest: str) -> int:
    """Where the userinfo of ``rest`` (a URL after ``scheme://``) ends: the
    last "@" before the query string, which starts at the first "?" after the
    first "@" (a raw "@", ":", "/" or "?" may sit in a password; an "@" in a
    query value is no separator). -1 without userinfo."""
    first = rest.find("@")
    if first < 0:
        return -1
    query = rest.find("?", first)
    return rest.rfind("@", 0, query if query >= 0 else len(rest))


def _encode(part: str) -> str:
    return quote(unquote(part), safe="")


def _connect_hint(detail: str) -> str:
    """What to do about a connection the server refused or never answered."""
    if "password authentication failed" in detail or "does not exist" in detail or "no pg_hba.conf" in detail:
        return ("check the login, password and database of the PostgreSQL connection (the Airflow connection's "
                "login, password and schema, or the URL given)")
    return ("check that the server is up and reachable from this host at the connection's host and port, and the "
            "connection's other settings (its extra: sslmode, connect_timeout, ...)")


def connect(url: str, purpose: str, *, autocommit: bool = True, connect_timeout: int = 10) -> psycopg.Connection:
    """A connection to the target database, for ``purpose`` (also its
    application_name). A database that cannot be reached raises
    LedgerUnavailable, a URL libpq cannot use raises ConfigurationError; both
    redacted, and without the driver's exception chained (its text holds the
    unredacted conninfo)."""
    import psycopg
    conninfo = libpq_url(url)
    try:
        return psycopg.connect(conninfo, autocommit=autocommit, connect_timeout=connect_timeout,
                               application_name=f"airflow-eos {purpose}"[:63])
    except psycopg.OperationalError as exc:
        detail = redact(str(exc), url)
        error: Exception = LedgerUnavailable(
            f"cannot connect to the ledger database {redact(url)}: {detail.strip()}; "
            f"{_connect_hint(detail)}")
    except psycopg.Error as exc:  # libpq could not parse it: ProgrammingError
        detail = redact(str(exc), url)
        error = ConfigurationError(f"{redact(url)} is not a usable database URL: {detail.strip()}; give {_FORMS}")
    raise error


# ------------------------------------------------------------------ reuse

# A window's steps open the ledger a dozen times each (claim, plan, each state
# change, the commit) and a new PostgreSQL session costs the server a fork,
# authentication and cold catalog caches: ~10 ms of CPU, against ~0.3 ms for a
# query on a warm session (measured here). In the chaos soak new sessions were
# most of the database's CPU. So a thread keeps the few connections it finished
# with, reset, for its next ones.
IDLE_LIMIT_S = 30.0  # an idle connection older than this is closed, not reused
IDLE_PER_THREAD = 4  # idle connections a thread keeps, the oldest closed first


# DISCARD ALL but its DEALLOCATE ALL and DISCARD PLANS: the prepared statements
# stay, and psycopg, which prepares a query it has run 5 times, keeps knowing
# them (after a second DISCARD ALL on a connection it did not forget them and
# ran one the server no longer had: "prepared statement _pg3_0 does not exist").
_RESET = "CLOSE ALL; RESET ALL; UNLISTEN *; SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES"


class _Idle(threading.local):
    """This thread's idle connections, oldest first: [(key, connection, since)]."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.conns: list[tuple[tuple, psycopg.Connection, float]] = []


_idle = _Idle()
# Sessions of the parent, copied into a forked child: never used nor closed
# there (closing would end them for the parent), so kept from the collector.
_forked_away: list = []


def _idle_conns() -> list[tuple[tuple, psycopg.Connection, float]]:
    """This thread's idle connections, those past IDLE_LIMIT_S closed."""
    if _idle.pid != os.getpid():
        _forked_away.append(_idle.conns)
        _idle.conns, _idle.pid = [], os.getpid()
    now, idle = time.monotonic(), _idle.conns
    while idle and now - idle[0][2] > IDLE_LIMIT_S:
        idle.pop(0)[1].close()
    return idle


def close_idle() -> None:
    """Close the connections this thread keeps for reuse: before dropping a
    database, or using it as a template, from the thread that used it."""
    idle = _idle_conns()
    while idle:
        idle.pop()[1].close()


def _ends_idle(conn: psycopg.Connection) -> bool:
    """Whether the server can end a session idle too long (PostgreSQL 14+).
    A kept connection is only closed on this side when its thread next opens
    one; a thread that never does (a long-lived API server's or triggerer's)
    would hold it for good. So the server itself ends it after IDLE_LIMIT_S."""
    return conn.info.server_version >= 140000


def _take(key: tuple, doing: str | None) -> psycopg.Connection | None:
    """An idle connection of this thread for ``key`` that still answers, named
    for ``doing`` (see :func:`reused`), or None."""
    from psycopg import sql
    idle = _idle_conns()
    for i in range(len(idle) - 1, -1, -1):
        if idle[i][0] == key:
            conn = idle.pop(i)[1]
            try:
                # The round trip that proves it alive (a restarted server, a
                # dropped database, the server's idle timeout: take none), and
                # the server's own idle timeout back to what a new session has.
                check = sql.SQL("RESET idle_session_timeout" if _ends_idle(conn) else "SELECT 1")
                conn.execute(check if doing is None else sql.SQL("; ").join([check, _naming(doing)]))
                return conn
            except Exception:  # noqa: BLE001 - any failure means: not this one
                conn.close()
    return None


def _naming(doing: str) -> psycopg.sql.Composable:
    """The statement that names the session for ``doing`` as :func:`connect`
    names a new one, until :func:`_give_back`'s RESET ALL puts back the name
    it opened with."""
    from psycopg import sql
    return sql.SQL("SELECT set_config('application_name', {}, false)").format(
        sql.Literal(f"airflow-eos {doing}"[:63]))


def _give_back(key: tuple, conn: psycopg.Connection) -> None:
    """Keep ``conn`` for this thread's next use, as a new one would be: its
    transaction rolled back (as closing it would), its session reset (_RESET:
    temp tables, settings, locks); or close it
    if it cannot be (broken, or interrupted in the middle of a statement)."""
    from psycopg.pq import TransactionStatus
    try:
        if conn.closed or conn.broken or conn.info.transaction_status == TransactionStatus.ACTIVE:
            raise ConnectionError
        if conn.info.transaction_status != TransactionStatus.IDLE:
            conn.rollback()
        conn.autocommit = True
        conn.execute(_RESET + (f"; SET idle_session_timeout = {max(1, int(IDLE_LIMIT_S * 1000))}"
                               if _ends_idle(conn) else ""))
    except Exception:  # noqa: BLE001 - not reusable: closed below
        conn.close()
        return
    idle = _idle_conns()
    idle.append((key, conn, time.monotonic()))
    while len(idle) > IDLE_PER_THREAD:
        idle.pop(0)[1].close()


@contextlib.contextmanager
def reused(url: str, purpose: str, *, doing: str | None = None, autocommit: bool = True,
           connect_timeout: int = 10) -> Iterator[psycopg.Connection]:
    """A connection as :func:`connect` makes one, for the block: one this thread
    finished with (reset, checked with a round trip) when there is one, else a
    new one. After the block it is kept as closing would leave it (an open
    transaction rolled back, session state discarded) for IDLE_LIMIT_S at most,
    or closed. A thread keeps IDLE_PER_THREAD at most; they close with it.

    ``purpose`` names the kind of use (its connections are only reused for
    it) and the session while it rests; ``doing`` (``"commit <attempt>"``), if
    given, is the session's application_name during the block, so that
    pg_stat_activity says which window a busy or blocked session works on."""
    key = (url, purpose, connect_timeout)
    conn = _take(key, doing)
    if conn is None:
        conn = connect(url, purpose, connect_timeout=connect_timeout)
        if doing is not None:
            _name(conn, doing)
    try:
        conn.autocommit = autocommit
        conn.isolation_level = conn.read_only = conn.deferrable = None
        yield conn
    finally:
        _give_back(key, conn)


def _name(conn: psycopg.Connection, doing: str) -> None:
    """A new connection's application_name for ``doing``; closed if that fails."""
    try:
        conn.execute(_naming(doing))  # in autocommit, as connect() opens it: no transaction begins
    except BaseException:
        conn.close()
        raise
