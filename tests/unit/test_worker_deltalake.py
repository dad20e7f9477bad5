"""A forked worker knows from its parent whether deltalake can run in it
(slotlake.table_processes): a parent whose deltalake runtime runs forks workers that hand
deltalake's work back at once, without trying (a try that fails costs ~80 ms, and with
staggered checkpoints some worker needs deltalake in nearly every batch)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

# Run in a fresh interpreter: the test process has long since started deltalake.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    from slotlake import table_processes as tp

    tries = []
    real = tp._deltalake_works

    def counted():
        tries.append(1)
        return real()

    tp._deltalake_works = counted

    def job(name):
        return {"works": tp._deltalake_here(), "tried": len(tries)}

    def in_worker():
        lane = tp.TableProcesses.open(1, job)
        try:
            ok, answer, _ = lane.submit("t").result(timeout=120)
        finally:
            lane.close()
        assert ok, answer
        return answer

    out = {"started_before": tp.deltalake_started(), "fresh": in_worker()}
    from deltalake import write_deltalake
    write_deltalake(sys.argv[1], pa.table({"x": [1]}))
    out["started_after"] = tp.deltalake_started()
    out["after"] = in_worker()
    print(json.dumps(out))
    """
)


def test_workers_of_a_parent_running_deltalake_do_not_try_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "t")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["started_before"] is False
    # A parent without the runtime: its worker tries once, and deltalake works there.
    assert out["fresh"] == {"works": True, "tried": 1}
    assert out["started_after"] is True
    # Once the parent's runtime runs: the worker is told, tries nothing, hands it back.
    assert out["after"] == {"works": False, "tried": 0}
