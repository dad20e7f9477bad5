"""Filling unchanged TOAST values by replaying a table's events in commit order.

PostgreSQL leaves a large, unchanged, out-of-line value out of an UPDATE's new tuple
(kind 'u'). The decoder already filled what the message's own old image carries (a
full 'O' row, or key columns of a 'K' image). What remains is filled here, in order:

1. from the latest earlier event of the same row in this batch — following key changes,
   since an UPDATE that moves a row from key k0 to k1 carries its values along;
2. from the row's prior state (the lake's state before this batch), which the caller
   joins in *only* for the keys that still need it, as synthetic ``P`` events;
3. whatever is still unknown is listed in ``_missing_toast`` and never invented.

The replay also yields the final row of every key it touched, which is how the state
of a keyed table advances. It is plain Python over row dicts: Spark runs it per hash
bucket of the row lineage (see :mod:`slotlake.state`), tests run it directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

Row = dict[str, Any]

PRIOR = "P"


def _order(e: Row) -> tuple[int, int, int]:
    # Prior rows come first; then commit order, then the position inside the transaction.
    if e["_op"] == PRIOR:
        return (0, 0, 0)
    return (1, e["_commit_lsn"], e["_tx_ordinal"])


def replay(
    events: Iterable[Row],
    data_columns: Sequence[str],
    truncations: Sequence[tuple[int, int]] = (),
) -> Iterator[tuple[str, Row]]:
    """Replay one bucket of events; yields ("E", event), ("S", final row) and ("K", key) items.

    Each event dict has the data columns, ``_op`` (I/U/D or P for a prior-state row),
    ``_commit_lsn``, ``_tx_ordinal``, ``_k_before``/``_k_after`` (the row's key before and
    after the event, as comparable strings), ``_unchanged`` (columns still open) and
    ``_fallback`` (list of (column, text) pairs for values kept as text).
    ``truncations`` are the (commit_lsn, tx_ordinal) of the table's TRUNCATEs in this batch.
    "S" rows carry the data columns, ``_fallback``, ``_missing_toast`` and ``_k``; "K"
    items are keys touched by the batch (so their prior state rows are superseded).
    """
    prior: dict[str, Row] = {}
    current: dict[str, Row | None] = {}  # key → row after the latest event, None = deleted
    truncs = sorted(truncations)
    ti = 0
    prior_valid = True
    for e in sorted(events, key=_order):
        op = e["_op"]
        if op == PRIOR:
            prior[e["_k_after"]] = e
            continue
        position = (e["_commit_lsn"], e["_tx_ordinal"])
        while ti < len(truncs) and truncs[ti] < position:
            # Rows before a TRUNCATE are gone; their keys stay touched so that no
            # prior-state row survives the merge.
            current = dict.fromkeys(current)
            prior_valid = False
            ti += 1
        fallback = dict(e.get("_fallback") or ())
        if op == "I":
            # An INSERT leaves a value out only when a publication's row filter made it of
            # an UPDATE that moved a row in (pgoutput_row_filter): the lake never had the
            # row, nothing can fill it.
            e["_missing_toast"] = list(e["_unchanged"] or ())
            current[e["_k_after"]] = e
        elif op == "U":
            before, after = e["_k_before"], e["_k_after"]
            if before in current:
                base = current[before]
            else:
                base = prior.get(before) if prior_valid else None
            missing: list[str] = []
            if e["_unchanged"]:
                base_fallback = dict(base.get("_fallback") or ()) if base is not None else {}
                base_missing = set(base.get("_missing_toast") or ()) if base is not None else set()
                for col in e["_unchanged"]:
                    if base is None or col in base_missing:
                        missing.append(col)
                        continue
                    e[col] = base.get(col)
                    if col in base_fallback:
                        fallback[col] = base_fallback[col]
            e["_missing_toast"] = missing
            e["_fallback"] = sorted(fallback.items())
            if before != after:
                current[before] = None
            current[after] = e
        elif op == "D":
            e["_missing_toast"] = []
            current[e["_k_before"]] = None
        yield "E", e
    # A truncate after every event of this bucket still empties the rows it saw.
    if ti < len(truncs):
        current = dict.fromkeys(current)
    for key, row in current.items():
        if row is None:
            yield "K", {"_k": key}
        else:
            final = {c: row.get(c) for c in data_columns}
            final["_fallback"] = [(k, v) for k, v in (row.get("_fallback") or ()) if k in final]
            final["_missing_toast"] = list(row.get("_missing_toast") or ())
            final["_k"] = key
            yield "S", final


def lineage_roots(edges: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Union-find over key changes (old key, new key): key → a canonical lineage root.

    Events of one row keep one lineage across UPDATEs that change its key, so they land
    in the same replay bucket. Only keys that appear in an edge are in the result.
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {k: find(k) for k in parent}
