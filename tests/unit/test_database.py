"""Connection strings: every form users copy is understood or refused in words,
and no password survives redaction, whatever the form. Pure string handling;
tests/integration/test_cli.py runs the same forms against a real server."""

from __future__ import annotations

import re
from urllib.parse import unquote

import psycopg.conninfo as ci
import pytest

from airflow_eos.core.database import libpq_url, redact
from airflow_eos.core.errors import ConfigurationError
from harness.leaks import PASSWORD, leaked


URL_FORMS = {
    "libpq URL": f"postgresql://u:{PASSWORD}@db.example:5432/orders",
    "postgres scheme": f"postgres://u:{PASSWORD}@db.example/orders",
    "SQLAlchemy psycopg2": f"postgresql+psycopg2://u:{PASSWORD}@db.example:5432/orders",
    "SQLAlchemy psycopg": f"postgresql+psycopg://u:{PASSWORD}@db.example:5432/orders",
    "JDBC": f"jdbc:postgresql://db.example:5432/orders?user=u&password={PASSWORD}",
    "query password": f"postgresql://u@db.example/orders?password={PASSWORD}&sslmode=disable",
    "query sslpassword": f"postgresql://u@db.example/orders?sslpassword={PASSWORD}",
    "conninfo quoted": f"host=db.example dbname=orders user=u password='{PASSWORD}'",
    "conninfo unquoted": f"host=db.example dbname=orders user=u password={PASSWORD}",
    "conninfo spaced": f"host=db.example password = '{PASSWORD}' dbname=orders",
    "conninfo unterminated quote": f"host=db.example password='{PASSWORD} dbname=orders",
}


@pytest.mark.parametrize("url", URL_FORMS.values(), ids=URL_FORMS.keys())
def test_redact_masks_the_password_of_every_form(url):
    assert leaked(redact(url)) == [], redact(url)
    # As libpq quotes it in its messages, alone and with the URL it was given.
    message = f'missing "=" after "{url}" in connection info string'
    assert leaked(redact(message)) == [] and leaked(redact(message, url)) == []
    assert "db.example" in redact(url)  # where it points stays readable


def test_redact_with_the_url_masks_fragments_libpq_quotes_alone():
    url = f"postgresql://u:{PASSWORD}@db.example/orders"
    # libpq cut a raw "@" password at its first "@" and named the rest as the host.
    message = "failed to resolve host 'p:w%40x@db.example': Name or service not known"
    assert leaked(redact(message, url)) == []
    assert redact("host 'db.example' refused", url) == "host 'db.example' refused"


@pytest.mark.parametrize("url", [u for k, u in URL_FORMS.items() if "unterminated" not in k])
def test_every_accepted_form_becomes_a_libpq_string_with_the_password_intact(url):
    parsed = ci.conninfo_to_dict(libpq_url(url))
    assert parsed.get("password", parsed.get("sslpassword")) == unquote(PASSWORD) or \
        parsed.get("password") == PASSWORD  # conninfo values are not percent-decoded
    assert parsed["host"] == "db.example" and parsed["dbname"] == "orders"


def test_sqlalchemy_and_raw_separators_are_normalised():
    assert libpq_url("postgresql+psycopg2://u:a@b:c@h:5/db") == "postgresql://u:a%40b%3Ac@h:5/db"
    assert libpq_url("postgresql://u:p%40ss@h/db") == "postgresql://u:p%40ss@h/db"  # already encoded: unchanged
    assert libpq_url("postgresql://h/db") == "postgresql://h/db"
    assert libpq_url("host=h dbname=db") == "host=h dbname=db"


@pytest.mark.parametrize("url, message", [
    (f"jdbc:postgresql://h/db?user=u&password={PASSWORD}&ssl=true", "JDBC parameter(s) ssl have no libpq"),
    (f"jdbc:mysql://h/db?user=u&password={PASSWORD}", "JDBC URL for another database"),
    (f"mysql://u:{PASSWORD}@h/db", "is not a PostgreSQL URL"),
    ("", "no database URL given"),
])
def test_unusable_forms_are_refused_in_words_and_redacted(url, message):
    with pytest.raises(ConfigurationError, match=re.escape(message)) as caught:
        libpq_url(url)
    assert leaked(str(caught.value)) == []
    assert "give a libpq URL like postgresql://alice:***@db.example:5432/orders" in str(caught.value)
    assert redact(str(caught.value)) == str(caught.value)
