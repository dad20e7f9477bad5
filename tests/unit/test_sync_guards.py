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
