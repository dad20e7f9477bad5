"""The golden-vector scenarios run live on PostgreSQL 15 and 16, decoded on the spot.

The stored vectors (tests/unit/test_pgoutput_golden.py) pin what a server produced once;
these runs catch what a server produces *now* (another minor version, other settings)
and check it against the same facts.
"""

from __future__ import annotations

import psycopg
import pytest

from slotlake.localpg import LocalPostgres
from slotlake.pgoutput import Relation, StreamAbort, decode
from tests.golden.capture import BY_NAME, GOLDEN_DIR, SCENARIOS, load, run_scenario
from tests.unit.test_pgoutput_golden import CLASS_BY_CODE, verify_capture

# Streamed scenarios depend on memory accounting for where segments split: compare their
# facts, not their exact message sequence.
STREAMED = {"stream_p2", "stream_parallel_p4", "two_phase_p3"}


def _run(pg_cluster: LocalPostgres, pg_dsn: str, name: str):  # type: ignore[no-untyped-def]
    scenario = BY_NAME[name]
    assert pg_cluster.version is not None
    if not scenario.supported(pg_cluster.version):
        # An older server must refuse the newer protocol outright, not decode it wrongly.
        with pytest.raises(psycopg.Error, match=r"proto_version|streaming requires a Boolean"):
            run_scenario(pg_dsn, pg_cluster.version, scenario)
        return None
    return run_scenario(pg_dsn, pg_cluster.version, scenario)


@pytest.mark.parametrize("name", [s.name for s in SCENARIOS])
def test_live_scenario_decodes_to_its_facts(
    pg_cluster: LocalPostgres, pg_dsn: str, name: str
) -> None:
    cap = _run(pg_cluster, pg_dsn, name)
    if cap is None:
        return
    msgs = verify_capture(cap.header(), cap.rows)
    assert msgs
    if name not in STREAMED:
        # Same workload, same server major: the same sequence of message types as stored.
        stored = GOLDEN_DIR / f"pg{pg_cluster.version}" / f"{name}.jsonl"
        _, rows = load(stored)
        assert [r.payload[:1] for r in cap.rows] == [r.payload[:1] for r in rows]


def test_live_streaming_produces_every_stream_message(
    pg_cluster: LocalPostgres, pg_dsn: str
) -> None:
    cap = _run(pg_cluster, pg_dsn, "stream_p2")
    codes = {r.payload[:1] for r in cap.rows}
    assert {b"S", b"E", b"c", b"A"} <= codes
    msgs = [decode(r.payload, in_stream=r.in_stream) for r in cap.rows]
    aborts = [m for m in msgs if isinstance(m, StreamAbort)]
    assert {a.xid == a.subxid for a in aborts} == {True, False}
    # Relation inside a stream carries the transaction's xid.
    assert any(isinstance(m, Relation) and m.xid is not None for m in msgs)


def test_live_two_phase_spans_two_peek_calls(pg_cluster: LocalPostgres, pg_dsn: str) -> None:
    cap = _run(pg_cluster, pg_dsn, "two_phase_p3")
    by_call: dict[int, set[bytes]] = {}
    for row in cap.rows:
        by_call.setdefault(row.call, set()).add(row.payload[:1])
    # PREPARE in the first call; after the slot advanced, only the outcome in the second.
    assert {b"b", b"P", b"p"} <= by_call[0]
    assert by_call[1] == {b"K", b"r"}
    assert set(CLASS_BY_CODE) >= by_call[0] | by_call[1]
