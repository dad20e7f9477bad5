"""``slotlake --help``: what a first-time user reads before anything else."""

from __future__ import annotations

import pytest

from slotlake.cli import build_parser


def test_the_top_level_help_says_what_slotlake_does_and_how_it_connects() -> None:
    text = " ".join(build_parser().format_help().split())
    assert "logical replication slot" in text
    assert "Delta Lake" in text
    # The secrets' conventions: a password never needs a command line or a file of ours.
    assert "PGPASSWORD" in text and "pgpass" in text
    for command in (
        "sync",
        "resnapshot",
        "status",
        "inspect",
        "reprocess",
        "bootstrap",
        "capture-ddl",
        "maintain",
        "demo",
    ):
        assert command in text, command


@pytest.mark.parametrize("command", ["sync", "status", "maintain", "bootstrap", "reprocess"])
def test_commands_that_read_a_lake_take_a_config_and_overrides(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args([command, "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "--config" in out and "--set KEY=VALUE" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rows", "-5"], "argument --rows: must be 1 or more, got -5"),
        (["--rows", "x"], "argument --rows: expects a whole number, got 'x'"),
        (["--pg-version", "14"], "argument --pg-version: invalid choice: 14 (choose from 15, 16)"),
    ],
)
def test_demo_refuses_bad_arguments_before_it_starts(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["demo", *args])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().endswith(message)
