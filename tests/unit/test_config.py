import os
from pathlib import Path

import pytest

from slotlake.config import ConfigError, load_config, parse_overrides

TOML = """
[source]
dsn = "host=db.internal port=5432 dbname=app user=replicator"
slot = "lake_slot"
publications = ["a", "b"]
proto_version = 2
streaming = true
settings = { logical_decoding_work_mem = "256MB" }

[lake]
path = "/data/lake"
raw_retention_batches = 100

[spark]
"spark.master" = "local[4]"
"spark.sql.shuffle.partitions" = 8
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_file_values_and_typed_fields(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, TOML))
    assert cfg.source.slot == "lake_slot"
    assert cfg.source.publications == ["a", "b"]
    assert (
        cfg.source.proto_version == 2
        and cfg.source.streaming is True
        and cfg.source.binary is False
    )
    assert cfg.source.settings == {"logical_decoding_work_mem": "256MB"}
    assert cfg.lake.path == "/data/lake" and cfg.lake.raw_retention_batches == 100
    assert cfg.lake.state_versions == 3  # default
    assert cfg.spark == {"spark.master": "local[4]", "spark.sql.shuffle.partitions": "8"}


def test_overrides_win_and_parse_as_toml(tmp_path: Path) -> None:
    overrides = parse_overrides(
        [
            "source.slot=other",
            "source.binary=true",
            "lake.path=/tmp/x",
            'source.publications=["p"]',
            "spark.spark.master=local[1]",
        ]
    )
    cfg = load_config(write(tmp_path, TOML), overrides)
    assert cfg.source.slot == "other"
    assert cfg.source.binary is True
    assert cfg.lake.path == "/tmp/x"
    assert cfg.source.publications == ["p"]
    assert cfg.spark["spark.master"] == "local[1]"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("source.nope=1", "unknown configuration key source.nope"),
        ("source.binary=yes", "source.binary must be true or false"),
        ("source.proto_version=five", "must be an integer"),
        ("source.proto_version=7", "proto_version must be 1 to 4"),
        ("source.proto_version=1", "streaming needs source.proto_version >= 2"),
        ("weird.key=1", r"unknown configuration section \[weird\]"),
        ("source.adbc_min_mb=-1", r"source.adbc_min_mb must be 0 \(off\) or more, got -1.0"),
        ("source.split_peek_mb=-2", r"source.split_peek_mb must be 0 \(off\) or more"),
        ("lake.driver_write_mb=-1", "lake.driver_write_mb must be 0 or more, got -1"),
        ("lake.driver_write_rows=lots", 'lake.driver_write_rows must be an integer or "auto"'),
        ("lake.driver_write_mb=true", 'lake.driver_write_mb must be an integer or "auto"'),
        ("lake.bootstrap_driver_mb=-64", "lake.bootstrap_driver_mb must be 0 or more"),
        ("lake.table_workers=0", "lake.table_workers must be 1 or more, got 0"),
        ("lake.table_processes=-1", "lake.table_processes must be 0 or more, got -1"),
        ("lake.table_processes=many", 'lake.table_processes must be an integer or "auto"'),
        ("lake.raw_retention_batches=-2", "lake.raw_retention_batches must be -1 or more"),
        ("lake.state_versions=-1", "lake.state_versions must be 0 or more"),
        ("source.slot=Bad-Name", r"source.slot must be 1 to 63 lowercase .* got 'Bad-Name'"),
        ("source.slot=" + "s" * 64, "source.slot must be 1 to 63 lowercase letters"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, TOML), parse_overrides([override]))


def test_override_syntax_errors() -> None:
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["nonsense"])


@pytest.mark.parametrize(
    "dsn",
    ["host=x password=hunter2 dbname=y", "postgresql://u:hunter2@x/y", "host=x PASSWORD='hunter2'"],
)
def test_password_in_dsn_is_refused_without_echoing_it(tmp_path: Path, dsn: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, {"source.dsn": dsn})
    assert "hunter2" not in str(err.value)
    assert "PGPASSWORD" in str(err.value)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml")


def test_toml_syntax_error_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"c\.toml"):
        load_config(write(tmp_path, "[source\nslot="))


def test_driver_lane_bounds_are_auto_by_default_or_as_set(tmp_path: Path) -> None:
    from slotlake.batch import DriverWrites

    cfg = load_config(write(tmp_path, TOML))
    assert cfg.lake.driver_write_rows is None and cfg.lake.driver_write_mb is None
    gib = 1 << 30
    big, small = DriverWrites.of(cfg.lake, 24 * gib), DriverWrites.of(cfg.lake, 4 * gib)
    assert (big.max_rows, big.max_bytes >> 20) == (1_342_177, 768)
    assert (small.max_rows, small.max_bytes >> 20) == (223_696, 128)
    assert DriverWrites.of(cfg.lake).max_bytes > 0  # this machine's own limit
    cfg = load_config(
        write(tmp_path, TOML),
        parse_overrides(["lake.driver_write_rows=5000", "lake.driver_write_mb=auto"]),
    )
    chosen = DriverWrites.of(cfg.lake, 4 * gib)
    assert (chosen.max_rows, chosen.max_bytes >> 20) == (5000, 128)
    assert "5,000 rows a table, 128 MiB of payloads" in chosen.describe()


def test_table_processes_are_one_a_core_by_default_and_only_for_enough_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slotlake import table_processes
    from slotlake.batch import DriverWrites

    cfg = load_config(write(tmp_path, TOML))
    assert cfg.lake.table_processes is None
    assert DriverWrites.of(cfg.lake).processes is None
    assert table_processes.cores() == len(os.sched_getaffinity(0))  # a cpuset, not the host
    monkeypatch.setattr(table_processes, "cores", lambda: 2)
    assert table_processes.processes_for(None, 100) == 2
    assert table_processes.processes_for(None, table_processes.MIN_TABLES - 1) == 0
    assert table_processes.processes_for(None, table_processes.MIN_TABLES) == 2
    # Never more workers than tables to keep each busy for a few.
    assert table_processes.processes_for(16, table_processes.MIN_TABLES + 4) == 2
    assert table_processes.processes_for(0, 100) == 0
    assert table_processes.processes_for(1, 100) == 0  # one worker is no better than threads
    monkeypatch.setattr(table_processes, "cores", lambda: 1)
    assert table_processes.processes_for(None, 100) == 0
    cfg = load_config(write(tmp_path, TOML), parse_overrides(["lake.table_processes=3"]))
    assert DriverWrites.of(cfg.lake).processes == 3


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("p", ["p"]),
        ("p,p2", ["p", "p2"]),
        (" p , p2 ,", ["p", "p2"]),
        ('["a,b", "c"]', ["a,b", "c"]),
    ],
)
def test_publications_from_the_command_line(tmp_path: Path, value: str, names: list[str]) -> None:
    cfg = load_config(write(tmp_path, TOML), parse_overrides([f"source.publications={value}"]))
    assert cfg.source.publications == names
