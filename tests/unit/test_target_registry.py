"""What a registered target kind brings besides its spec (issue 36: a target
is one folder plus one registry line): its own ``airflow-eos`` commands
(TargetSpec.commands) and its own tables in the ledger
(TargetSpec.ledger_migrations), which the core's migration list no longer holds."""

from __future__ import annotations

import io
import re

import pytest

import airflow_eos.cli as cli
from airflow_eos.core.errors import ConfigurationError
from airflow_eos.core.migrations import MIGRATIONS
from airflow_eos.core.schema import target_migrations
from airflow_eos.core.target import TargetCommand, target_commands

CREATED = re.compile(r"CREATE TABLE (?:IF NOT EXISTS )?eos\.(\w+)")


def test_each_kinds_steps_are_numbered_from_1_with_those_shipped_as_core_versions_first():
    core = dict(MIGRATIONS)
    shipped_by: dict[int, list[str]] = {}
    for kind, steps in target_migrations().items():
        assert [step.version for step in steps] == list(range(1, len(steps) + 1)), kind
        shipped = [step.shipped_as for step in steps if step.shipped_as is not None]
        assert [step.shipped_as for step in steps[:len(shipped)]] == shipped == sorted(shipped), kind
        for version in shipped:
            assert version in core and core[version] is None, (kind, version)  # its SQL is the kind's, not the core's
            shipped_by.setdefault(version, []).append(kind)
    # every version the core's list leaves to a kind is one kind's step
    assert {version: len(kinds) for version, kinds in shipped_by.items()} == \
        {version: 1 for version, sql in MIGRATIONS if sql is None}


def test_the_core_migrations_create_no_table_of_a_kind():
    core_tables = {table for _, sql in MIGRATIONS if sql for table in CREATED.findall(sql)}
    kind_tables = {table for steps in target_migrations().values() for step in steps
                   for table in CREATED.findall(step.sql)}
    assert {"kafka_commits", "kafka_intents"} <= kind_tables
    assert core_tables & kind_tables == set()


def test_a_kinds_commands_are_the_clis_with_its_connection_options_and_exit_codes():
    names = [command.name for command in target_commands()]
    assert "resolve" in names and len(names) == len(set(names))
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["resolve", "--help"], out=out, err=err) == 0


def probe(fail: bool) -> TargetCommand:
    def run(ledger_url, args, out):
        if fail:
            raise ConfigurationError(f"no thing {args.thing!r} in {ledger_url}")
        print(f"{args.thing} in {ledger_url}", file=out)
        return 0

    return TargetCommand(name="probe", help="a probe", description="A probe of a target kind's command.",
                         add_arguments=lambda parser: parser.add_argument("--thing", required=True), run=run)


@pytest.mark.parametrize("fail", [False, True])
def test_a_kinds_command_runs_on_the_ledger_the_cli_options_name(monkeypatch, fail):
    monkeypatch.setattr(cli, "target_commands", lambda: [probe(fail)])
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["probe", "--postgres-url", "postgresql://eos@db.example/orders", "--thing", "x"], out=out,
                    err=err)
    if fail:
        assert (code, out.getvalue()) == (2, "")
        assert err.getvalue() == "airflow-eos probe: error: no thing 'x' in postgresql://eos@db.example/orders\n"
    else:
        assert (code, out.getvalue(), err.getvalue()) == (0, "x in postgresql://eos@db.example/orders\n", "")
