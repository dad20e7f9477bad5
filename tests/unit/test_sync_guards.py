from pathlib import Path

import pytest

from slotlake.config import Config, LakeConfig, SourceConfig
from slotlake.lake import Lake
from slotlake.reprocess import IN_PLACE_MARKER
from slotlake.sync import SyncError, run_sync


def test_sync_refuses_a_lake_an_in_place_reprocess_left_half_done(tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake")
    lake.ensure_layout()
    (tmp_path / "lake" / IN_PLACE_MARKER).write_text("{}")
    cfg = Config(
        source=SourceConfig(dsn="host=127.0.0.1 port=1 dbname=x", slot="s"),
        lake=LakeConfig(path=str(tmp_path / "lake")),
    )
    # Refused before any connection is made (port 1 would fail otherwise).
    with pytest.raises(SyncError, match="in-place reprocess is running or was killed"):
        run_sync(cfg)


def test_publication_problem_names_missing_publications_and_left_out_actions() -> None:
    from slotlake.source import publication_problem

    every = ("pub", True, True, True, True)
    assert publication_problem([every], ["pub"], "db") is None
    missing = publication_problem([every], ["pub", "other"], "db")
    assert missing is not None and missing.startswith(
        "publication 'other' does not exist in database 'db'"
    )
    partial = publication_problem(
        [every, ("audit", True, False, False, True)], ["pub", "audit"], "db"
    )
    assert partial is not None
    assert partial.startswith(
        "publication 'audit' does not publish update, delete (publish = 'insert, truncate')"
    )
    assert "ALTER PUBLICATION audit SET (publish = 'insert, update, delete, truncate')" in partial
    nothing = publication_problem([("p", False, False, False, False)], ["p"], "db")
    assert nothing is not None and "(publish = 'nothing')" in nothing


def test_publication_problem_quotes_names_a_statement_needs_quoted() -> None:
    from slotlake.source import publication_problem

    missing = publication_problem([], ["Mixed Case"], "db")
    assert missing is not None and 'CREATE PUBLICATION "Mixed Case" FOR TABLE' in missing
    partial = publication_problem([('a"b', True, True, False, True)], ['a"b'], "db")
    assert partial is not None and 'ALTER PUBLICATION "a""b" SET' in partial
