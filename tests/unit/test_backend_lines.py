"""The lines that name a server session: the one holding the slot's lock, or the slot."""

from __future__ import annotations

from slotlake.source import Backend, locked_message


def test_the_holder_is_described_as_the_server_lists_it() -> None:
    remote = Backend(4242, "slotlake", "10.0.0.5", "2026-12-06 10:00:00", "idle", 3 * 3600 + 125)
    assert remote.describe() == (
        "PID 4242, application 'slotlake', from 10.0.0.5, connected 2026-12-06 10:00:00 UTC, "
        "idle for 3h02m"
    )
    local = Backend(7, None, "local", None, "active", 65)
    assert local.describe() == "PID 7, over a local socket, active for 1m05s"
    # Another role's session: pg_stat_activity hides all but the PID.
    assert Backend(8, None, None, None, None, None).describe() == "PID 8"
    assert Backend(9, "x", None, None, "idle", 4).describe().endswith("idle for 4s")


def test_the_line_says_what_the_run_does_and_how_to_end_a_stale_holder() -> None:
    assert locked_message("s", None, "nothing done") == (
        "another slotlake run holds the lock for slot s; nothing done"
    )
    holder = Backend(4242, "slotlake", "10.0.0.5", None, "idle", 0)
    assert locked_message("s", holder, "nothing done") == (
        "another slotlake run holds the lock for slot s (PID 4242, application 'slotlake', "
        "from 10.0.0.5, idle for 0s); nothing done. If that run is gone, end its session: "
        "SELECT pg_terminate_backend(4242)"
    )
