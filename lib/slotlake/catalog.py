"""Relation versions of one batch: which schema shapes which row, and how tables evolve.

pgoutput re-sends a Relation message before the first change of each relation in every
peek and again after an ALTER, so a batch's raw payloads describe themselves. The driver
collects the Relation and Type messages (a handful per table) and hands the executors a
:class:`TableCatalog` per table; a DML row is shaped by the latest Relation message of its
table that precedes it in peek order (``seq``).

Schema evolution rule (documented in the README):

* Columns are matched by attnum where the lake, the DDL capture trigger's reports or
  the target's catalog tell it (a name handed on or two names swapped between two
  versions included), else by name: a column whose name disappears between two
  consecutive versions while a new name appears *at the same position with the same
  type* is a RENAME. Older values are carried under the new name.
* ADD COLUMN appends a column; rows written before it have NULL there in the change log.
* DROP COLUMN: the change log keeps the column (NULL from the drop on); the state keeps
  only the columns of the latest version.
* ALTER COLUMN TYPE: the column takes the latest type when every earlier type widens to
  it losslessly (smallint→int→bigint, float→double, decimal(p,s)→decimal(p',s') with
  p'-s' ≥ p-s and s' ≥ s, anything→string), or moves between timestamp and timestamptz
  (cast at UTC); otherwise the column becomes string and older values are written as
  their text.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from slotlake.pgoutput import Relation, RelationColumn, Type
from slotlake.pgtypes import resolve_type

_INT_RANK = {"tinyint": 1, "smallint": 2, "int": 3, "bigint": 4}
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")
_TIMESTAMPS = {"timestamp", "timestamp_ntz"}


def table_name(rel: Relation) -> str:
    return f"{rel.namespace or 'pg_catalog'}.{rel.name}"


def another_relation(before: int | None, now: int) -> bool:
    """Whether the relation the lake last wrote a table from (``before``; None: unknown)
    is not ``now``'s: the table was dropped and created again under its name, and its
    columns are new ones whatever their names and attnums."""
    return before is not None and before != now


def widens_to(old: str, new: str) -> bool:
    """Whether every value of Spark type ``old`` is exactly representable in ``new``."""
    if old == new or new == "string":
        return True
    if old in _INT_RANK and new in _INT_RANK:
        return _INT_RANK[old] <= _INT_RANK[new]
    if old in _INT_RANK and (m := _DECIMAL.match(new)):
        digits = {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 19}[old]
        return int(m.group(1)) - int(m.group(2)) >= digits
    if old == "float" and new == "double":
        return True
    if {old, new} == _TIMESTAMPS:
        # PostgreSQL changes timestamp to timestamptz, or back, without a rewrite only in
        # a session whose zone is UTC, where the instant is the wall clock at UTC (as the
        # cast reads it under the lake's UTC). In another zone it rewrites every row,
        # and the table is copied (see Snapshots).
        return True
    mo, mn = _DECIMAL.match(old), _DECIMAL.match(new)
    if mo and mn:
        po, so, pn, sn = (int(x) for x in (*mo.groups(), *mn.groups()))
        return pn - sn >= po - so and sn >= so
    if old.startswith("array<") and new.startswith("array<"):
        return widens_to(old[6:-1], new[6:-1])
    return False


def final_type(types: Sequence[str]) -> str:
    """The lake's type of a column that has had ``types`` (in order): the last, when every
    earlier one widens to it, else string."""
    return types[-1] if all(widens_to(t, types[-1]) for t in types) else "string"


@dataclass(frozen=True)
class ColumnSpec:
    name: str  # name in the output (latest name after renames)
    type_oid: int
    typmod: int
    spark_ddl: str  # this version's own Spark type


@dataclass(frozen=True)
class RelationVersion:
    """One Relation message and the output names of its columns."""

    seq: int
    oid: int
    replica_identity: str
    columns: tuple[ColumnSpec, ...]
    key_columns: tuple[str, ...]
    type_names: tuple[
        tuple[int, str, str], ...
    ]  # (oid, namespace, name) of Type messages before it


def identity(version: RelationVersion) -> tuple[str, ...] | None:
    """A version's replica identity as the state uses it: its key columns (output names),
    or None for a multiset (FULL identity, or no key)."""
    if version.replica_identity == "f" or not version.key_columns:
        return None
    return version.key_columns


# Metadata columns of the change log; a leading underscore keeps them apart from table
# columns (PostgreSQL identifiers may start with '_' too: a clash is reported, not silently
# shadowed: slotlake.batch.check_published_columns).
META_COLUMNS: list[tuple[str, str]] = [
    ("_op", "string"),
    ("_commit_lsn", "bigint"),
    ("_lsn", "bigint"),
    ("_tx_ordinal", "bigint"),
    ("_xid", "bigint"),
    ("_commit_ts", "timestamp"),
    ("_origin", "string"),
    ("_batch", "bigint"),
    ("_old_kind", "string"),
    ("_missing_toast", "array<string>"),
    ("_fallback", "map<string,string>"),
    ("_truncate_options", "int"),
]
# Working columns that only live between decode and the write.
WORK_COLUMNS: list[tuple[str, str]] = [("_seq", "bigint"), ("_unchanged", "array<string>")]
# The names slotlake's own columns take: the change log's and the state's, the decoder's
# working columns, its old image (``_old``) and those of the TOAST fill and the MERGE. A
# source column of one of them is refused (slotlake.batch.check_published_columns), or,
# dropped again inside a batch, renamed in its change log (:meth:`_Lineage.settle`).
RESERVED = frozenset(
    {n for n, _ in META_COLUMNS + WORK_COLUMNS} | {"_old", "_k", "_kind", "_gid", "_bucket"}
)


@dataclass
class TableCatalog:
    """Everything the executors need to shape one table's rows of one batch."""

    name: str  # "schema.table"
    versions: list[RelationVersion] = field(default_factory=list)
    # Output columns: latest version's order, then columns dropped during the batch.
    columns: list[tuple[str, str]] = field(default_factory=list)  # (name, spark ddl)
    state_columns: list[str] = field(default_factory=list)  # columns of the latest version
    key_columns: list[str] = field(default_factory=list)
    replica_identity: str = "d"
    # Each earlier name of a column → its latest: one lookup, never chained.
    renames: dict[str, str] = field(default_factory=dict)
    text_columns: set[str] = field(default_factory=set)  # forced to string by a type change
    # A renamed column's name in the lake before the batch (latest → the lake's).
    lake_names: dict[str, str] = field(default_factory=dict)
    # A column of the latest version that a later name-sharing ADD made (DROP and re-ADD
    # of one name, told by attnums) → seq of the first version that has it.
    readded_at: dict[str, int] = field(default_factory=dict)
    # A relation oid that another table of the batch named too (renamed in the batch):
    # its DML rows are this table's only inside these (after seq, before seq) bounds,
    # as pgoutput's latest Relation message of the oid before each row says.
    shared: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # A table re-based on a copy for the batch: each latest column → the copy's name of it
    # ('' when the copy has none: added after it), told by attnums (slotlake.snapshot
    # .copy_names); empty when they are unknown (then by names, :meth:`prior_name`).
    copy_names: dict[str, str] = field(default_factory=dict)

    @property
    def oids(self) -> set[int]:
        return {v.oid for v in self.versions}

    @property
    def is_multiset(self) -> bool:
        """FULL identity or no key: rows are matched by their whole value."""
        return self.replica_identity == "f" or not self.key_columns

    def prior_name(self, name: str, have: Collection[str] | None = None, lake: bool = True) -> str:
        """The name the prior state has for the column ``name`` (its latest name):
        ``have``, the prior's columns, when known. Several earlier names lead to one
        latest (``a → b → c``): only the lake's is in the prior. ``lake``: the prior is
        the lake's state before the batch, so a name the batch gave to another lake
        column (``a → b``, ``c → a``) is that column's; else (a snapshot's copy, named as
        the source named its columns then) a name the prior has is taken as it is. A name
        the prior has for none of its columns any more gives ``''`` or a name it lacks:
        the caller reads the column as new."""
        if not lake and name in self.copy_names:
            return self.copy_names[name]
        if lake and name in self.lake_names:
            return self.lake_names[name]
        if have is not None and name in have:
            if lake and name in self.lake_names.values():
                # The lake's column of that name went to another name in the batch, which
                # gave this one to a column it added (``c → d``, ``ADD x``, ``x → c``):
                # none of the prior's columns is this one ('' is no column's name).
                return ""
            return name
        if name in self.lake_names:
            return self.lake_names[name]
        for old, new in self.renames.items():
            if new == name and (have is None or old in have):
                return old
        return name

    @property
    def identity_switches(self) -> bool:
        """Whether the batch's versions of the table differ in replica identity (keyed by
        other columns, or keyed and a multiset): its events are then applied one identity
        at a time (:mod:`slotlake.identity_segments`)."""
        return len({identity(v) for v in self.versions}) > 1

    def may_fall_back(self, column: str) -> bool:
        """Whether a value of ``column`` can have been kept as ``_fallback`` text.

        Only then must a MERGE compare ``_fallback`` too: reading that map for every row
        of the target costs more than the key itself. A column no version knows counts as
        one that may (the state may hold values of an earlier type).
        """
        seen = False
        for version in self.versions:
            names = {oid: (ns, name) for oid, ns, name in version.type_names}
            for col in version.columns:
                if col.name == column:
                    seen = True
                    if resolve_type(col.type_oid, col.typmod, names).may_fall_back:
                        return True
        return not seen

    def version_at(self, oid: int, seq: int) -> RelationVersion:
        candidates = [v for v in self.versions if v.oid == oid]
        seqs = [v.seq for v in candidates]
        i = bisect.bisect_left(seqs, seq) - 1
        if i < 0:
            raise LookupError(
                f"no Relation message for table {self.name} (oid {oid}) before seq {seq}"
            )
        return candidates[i]


def _renames(
    prev: Sequence[tuple[str, str]],
    new: Sequence[tuple[str, str]],
    ids: ColumnIds | None = None,
    origin: Callable[[str], str | None] = lambda name: name,
    prev_seq: int = -1,
    new_seq: int = -1,
) -> tuple[dict[str, str], frozenset[str]]:
    """Columns of ``prev`` that ``new`` has under another name (old name → new name), and
    the names ``new`` gives a column added under a name ``prev`` had (a DROP and re-ADD
    between the two, told by the attnums: :func:`_handed_on`).

    Both are (name, spark ddl) lists in attnum order. A Relation message names no attnum,
    so a rename is told from a DROP plus an ADD by the attnums when ``ids`` knows them
    for every column that went and every one that came, or for every column that went
    and each is found among those that came (a column's identity: the same attnum under
    another name is a rename, whatever its type became); a column the batch added may be
    pinned by the lake's relnatts (:meth:`ColumnIds.added_in_batch`); ``origin`` gives
    the lake's name of a column of ``prev`` (``a`` for ``b`` after ``a → b`` inside the
    batch), None for one the batch added; a name the lake and the target lack is looked up
    in the DDL reports as of its version (``prev_seq``, ``new_seq``). Else by position:
    a rename keeps the position and the type; ADD appends and DROP removes, so any other
    difference is not a rename (which a DROP and an ADD in one step can fool).
    """
    if ids is not None:
        moved = _handed_on(prev, new, ids, origin, prev_seq, new_seq)
        if moved is not None:
            return moved
    return _renamed(prev, new, ids, origin, prev_seq, new_seq), frozenset()


def _renamed(
    prev: Sequence[tuple[str, str]],
    new: Sequence[tuple[str, str]],
    ids: ColumnIds | None,
    origin: Callable[[str], str | None],
    prev_seq: int,
    new_seq: int,
) -> dict[str, str]:
    """:func:`_renames` where no name moved to another column: by the attnums of the
    columns that went and came, else by position."""
    prev_names = {n for n, _ in prev}
    new_names = {n for n, _ in new}
    gone = [n for n, _ in prev if n not in new_names]
    came = [n for n, _ in new if n not in prev_names]
    if not gone or not came:
        return {}
    if ids is not None:
        # A name the lake has no attnum for (a middle name of the batch) may have one in
        # the DDL reports as of its version.
        prev_at, new_at = ids.as_of(prev_seq), ids.as_of(new_seq)
        old_ids = {}
        for n in gone:
            lake = origin(n)
            if lake is not None and lake in ids.before:
                old_ids[n] = ids.before[lake]
            else:
                old_ids[n] = prev_at.get(n, ids.after.get(n))
        if None in old_ids.values():
            # A column the batch added: its attnum may follow from the lake's relnatts.
            pinned = ids.added_in_batch(prev, origin)
            old_ids = {n: pinned.get(n) if i is None else i for n, i in old_ids.items()}
        new_ids = {n: new_at.get(n, ids.after.get(n, ids.before.get(n))) for n in came}
        by_id = {i: n for n, i in new_ids.items() if i is not None}
        found = {n: by_id[i] for n, i in old_ids.items() if i is not None and i in by_id}
        if None not in old_ids.values():
            # Every column that went found under another name: the others came (an ADD
            # dropped again by the target has no attnum, but cannot be one of them).
            if None not in new_ids.values() or len(found) == len(gone):
                return found
        elif found and len(found) == len(came):
            # Some that went have no attnum (added after the lake read its attnums, a
            # copy's say, and dropped before the target), but the attnums explain every
            # column that came: those went by another name, the unknown ones were dropped.
            return found
    if len(prev) != len(new):
        return {}
    renamed: dict[str, str] = {}
    for (old_name, old_ddl), (new_name, new_ddl) in zip(prev, new, strict=True):
        if old_name == new_name:
            continue
        if old_ddl != new_ddl or old_name in new_names:
            return {}
        renamed[old_name] = new_name
    return renamed


@dataclass(frozen=True)
class ColumnIds:
    """A table's column attnums (name → attnum) when the lake last wrote it (``before``:
    ``TableCommit.attnums``) and at the batch's target (``after``: the catalog sync read
    with the target), each empty when unknown; ``points``: (seq, attnums) after each DDL
    the capture trigger reported in the batch, in seq order."""

    before: Mapping[str, int]
    after: Mapping[str, int]
    points: tuple[tuple[int, Mapping[str, int]], ...] = ()
    # pg_class.relnatts when the lake last wrote the table (every attnum given by then,
    # dropped columns' too), and the columns the target's Relation message would send:
    # None when unknown (a lake or catalog file from before they were recorded).
    natts_before: int | None = None
    sent_after: frozenset[str] | None = None
    # The relation the lake last wrote the table from (None: unknown): a Relation message
    # of another oid is of a table dropped and created again under the name.
    oid_before: int | None = None

    def added_in_batch(
        self, prev: Sequence[tuple[str, str]], origin: Callable[[str], str | None]
    ) -> dict[str, int]:
        """Attnums of ``prev``'s columns added since the lake last wrote the table, where
        the target pins them (else none).

        Attnums are given in order (``natts + 1``, ``+ 2``, …) and never reused, and a
        Relation message lists its columns in attnum order. A column the target sends
        with attnum ``natts + i`` was added before any later one and is alive from then
        to the target, so if ``natts + 1`` … ``natts + i`` all are such columns, the
        first ``i`` added columns a Relation lists are those, whatever names they had.
        A column added and dropped unseen breaks the run, and no more is pinned."""
        if self.natts_before is None or self.sent_after is None or not self.before:
            return {}
        lake = [origin(n) for n, _ in prev]
        known = [o in self.before for o in lake]
        added = [n for (n, _), k in zip(prev, known, strict=True) if not k]
        # Only when every column of the lake is told apart: one whose rename the batch
        # did not see would pass for an added one and shift the attnums. The lake's
        # columns come first (smaller attnums), and each the target still sends was alive
        # when ``prev`` was sent, so ``prev`` must show it under a name followed to it.
        if known != sorted(known, reverse=True):
            return {}
        seen = {self.before[o] for o, k in zip(lake, known, strict=True) if k}
        if any(
            a <= self.natts_before and a not in seen
            for n, a in self.after.items()
            if n in self.sent_after
        ):
            return {}
        by_attnum = {a: n for n, a in self.after.items()}
        out: dict[str, int] = {}
        for i, name in enumerate(added, start=1):
            attnum = self.natts_before + i
            target_name = by_attnum.get(attnum)
            if target_name is None or target_name not in self.sent_after:
                break
            if name in self.after and self.after[name] != attnum:
                return {}  # the same name is another column at the target: not pinned
            out[name] = attnum
        return out

    def as_of(self, seq: int) -> Mapping[str, int]:
        """The attnums the last DDL report before ``seq`` gave. A Relation message shows
        the table as of then: a name there has that attnum. Before the batch's first
        report the table is as the lake last wrote it, since the trigger reports every DDL
        after that: the lake's attnums (the target's would give a name the batch moves
        later, ``RENAME r TO c`` after a row, to the column that takes it). Empty when
        the batch has no report of the table (no trigger: nothing known)."""
        found: Mapping[str, int] | None = None
        for at, attnums in self.points:
            if at >= seq:
                break
            found = attnums
        if found is None:
            return self.before if self.points else {}
        return found


def _handed_on(
    prev: Sequence[tuple[str, str]],
    new: Sequence[tuple[str, str]],
    ids: ColumnIds,
    origin: Callable[[str], str | None],
    prev_seq: int,
    new_seq: int,
) -> tuple[dict[str, str], frozenset[str]] | None:
    """The renames between ``prev`` and ``new`` by attnum, when a name both have is
    another column in each (``RENAME a TO b`` and ``RENAME c TO a``, or a swap through a
    third name, between two Relation messages): names alone read those as no rename at
    all. With them the names of columns added under a name ``prev`` had (``DROP a``,
    ``ADD a``: a new column, whatever its name). None, for :func:`_renames`' other rules,
    when no name moved or an attnum is not known on either side.

    An attnum is taken from the lake (the column followed to its lake name), the DDL
    reports as of the message or the lake's relnatts (a column the batch added,
    :meth:`ColumnIds.added_in_batch`), else from the target for a name it has; both
    lists must then ascend, as a Relation message lists its columns in attnum order, or
    a name the target gave to another column was taken for this one."""
    prev_at, new_at = ids.as_of(prev_seq), ids.as_of(new_seq)
    pinned: dict[str, int] | None = None

    def before(name: str) -> int | None:
        nonlocal pinned
        lake = origin(name)
        if lake is not None and lake in ids.before:
            return ids.before[lake]
        if name in prev_at:
            return prev_at[name]
        if pinned is None:  # a column the batch added: maybe pinned by the lake's relnatts
            pinned = ids.added_in_batch(prev, origin)
        return pinned.get(name)

    was = {n: before(n) for n, _ in prev}
    now = {n: new_at.get(n, ids.after.get(n)) for n, _ in new}
    if not _ascending([was[n] for n, _ in prev]) or not _ascending([now[n] for n, _ in new]):
        return None
    if all(was[n] == now[n] for n in was.keys() & now.keys()):
        return None
    by_id = {i: n for n, i in now.items()}
    before_ids = set(was.values())
    fresh = frozenset(n for n in was.keys() & now.keys() if now[n] not in before_ids)
    return {n: by_id[i] for n, i in was.items() if i in by_id and by_id[i] != n}, fresh


def _ascending(attnums: Sequence[int | None]) -> bool:
    """Whether every attnum is known and each is above the one before."""
    known = [a for a in attnums if a is not None]
    return len(known) == len(attnums) and all(a < b for a, b in itertools.pairwise(known))


@dataclass
class _Lineage:
    """A table's columns followed through the versions of a batch, by identity.

    Names alone are ambiguous across versions: ``RENAME a TO b`` then ``RENAME c TO a``
    leaves a name that meant two columns, and ``a → b → b2`` a name that is neither the
    first nor the last. Each column gets an identity when first seen (the lake's columns
    before the batch, else the version that adds it); a step between two versions keeps
    an identity under its name, or moves it to the name a rename gives it."""

    names: list[list[str]] = field(default_factory=list)  # identity → its names, in order
    at: dict[str, int] = field(default_factory=dict)  # name in the latest version → identity
    prior: dict[str, int] = field(default_factory=dict)  # the lake's name → identity
    versions: list[list[int]] = field(default_factory=list)  # each version's identities
    added: set[int] = field(default_factory=set)  # identities a version after the first added
    # Latest names given by :meth:`settle` (identity → name), over ``names``' last.
    moved: dict[int, str] = field(default_factory=dict)
    # Change log columns of columns dropped in an earlier batch (the state no longer has
    # them) that :meth:`settle` moved out of a name a column of this batch takes.
    ghosts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, prior: Sequence[tuple[str, str]]) -> _Lineage:
        lineage = cls()
        for name, _ in prior:
            lineage.prior[name] = lineage.at[name] = lineage._new(name)
        return lineage

    def _new(self, name: str) -> int:
        self.names.append([name])
        return len(self.names) - 1

    def step(
        self, names: Sequence[str], renamed: Mapping[str, str], fresh: Collection[str] = ()
    ) -> None:
        """The next version's ``names``: ``renamed`` (old → new) keep their identity
        under the new name, ``fresh`` ones are new columns under a name the last had."""
        came_from = {new: old for old, new in renamed.items()}
        at: dict[str, int] = {}
        for name in names:
            old = came_from.get(name)
            if old is not None and old in self.at:
                ident = self.at[old]
                self.names[ident].append(name)
            elif name in self.at and name not in renamed and name not in fresh:
                ident = self.at[name]
            else:
                ident = self._new(name)
                if self.versions or self.prior:
                    self.added.add(ident)
            at[name] = ident
        self.at = at
        self.versions.append([at[n] for n in names])

    def origin(self, name: str) -> str | None:
        """The lake's name of the column the latest version has as ``name`` (None: a
        column the batch added)."""
        ident = self.at.get(name)
        if ident is None:
            return name
        return None if ident in self.added else self.names[ident][0]

    def final(self, ident: int) -> str:
        return self.moved.get(ident, self.names[ident][-1])

    def settle(
        self,
        logged: Callable[[], Mapping[str, str]] = dict,
        types: Mapping[int, Sequence[str]] | None = None,
    ) -> None:
        """A column dropped in the batch whose name another column took while both were
        there (``DROP a``, ``RENAME c TO a``) gets a latest name of its own, ``a__dropped``
        (its values in the change log, the lake's ``a`` renamed to it): under one name, a
        version showing both would put two columns' values in one place, and the state's
        ``a`` could not be renamed from ``c``. ``logged``: the table's change log's columns
        (name → type, top level and old image; read only when needed), which keeps the
        ``a__dropped`` of an earlier batch's replacement of ``a``.

        A dropped column whose name a later one took without both being there (``DROP
        a``, ``ADD a``) shares that column, unless its type does not widen to the later
        one's (``types``: each identity's types, in order): shared, the column would
        become text, which neither is, so it gets a name of its own too. The same holds
        for a column dropped in an earlier batch, which only the change log still has: a
        column of the batch (still there at its end or not) added under its name shares
        it while the type widens, and one renamed to it never does (the change log's
        rename would find the name taken)."""
        live = set(self.versions[-1])
        taken = {n for names in self.names for n in names}
        log: Mapping[str, str] | None = None

        def log_columns() -> Mapping[str, str]:
            nonlocal log, taken
            if log is None:
                log = logged()
                taken |= set(log)
            return log

        def own_name(ident: int, name: str) -> None:
            log_columns()
            new, k = f"{name}__dropped", 2
            while new in taken:
                new, k = f"{name}__dropped{k}", k + 1
            taken.add(new)
            self.moved[ident] = new

        for idents in [list(self.prior.values()), *self.versions]:
            by_name: dict[str, list[int]] = {}
            for ident in idents:
                by_name.setdefault(self.final(ident), []).append(ident)
            for name, group in by_name.items():
                if len(group) < 2:
                    continue
                owners = [i for i in group if i in live] or [
                    i for i in group if self.names[i][0] != name
                ]
                owner = owners[0] if owners else group[0]
                for ident in group:
                    if ident != owner:
                        own_name(ident, name)
        # A column named like one of slotlake's, added and dropped again inside the batch
        # (its table is clean at the target, so the sync did not refuse it): its values
        # go to a change-log column of its own name, which the next run would otherwise
        # refuse for every rerun of the batch.
        for ident in range(len(self.names)):
            if ident not in live and self.final(ident) in RESERVED:
                own_name(ident, self.final(ident))
        if types is None:
            return
        heirs = {self.final(i): i for i in live}
        for ident in range(len(self.names)):
            heir = heirs.get(self.final(ident))
            if ident in live or heir is None:
                continue
            heir_type = final_type(types[heir])
            if not all(widens_to(t, heir_type) for t in types[ident]):
                own_name(ident, self.final(ident))
        # Names new to the state, of the batch's columns still there or dropped in it: the
        # change log may hold them from an earlier drop. Only a batch that adds or renames
        # a column reads the change log's schema for it.
        new_names: dict[str, set[int]] = {}
        for idents in self.versions:
            for i in idents:
                if self.final(i) not in self.prior:
                    new_names.setdefault(self.final(i), set()).add(i)
        prior = set(self.prior.values())
        for name, takers in sorted(new_names.items()):
            old_type = log_columns().get(name)
            if old_type is None:
                continue
            if takers & prior or not all(
                widens_to(old_type, final_type(types[i])) for i in sorted(takers)
            ):
                ghost = self.ghosts[name] = self._new(name)
                own_name(ghost, name)
        # A name a column of the batch only passed through (``RENAME c3 TO c1``, a row,
        # ``RENAME c1 TO r12``) that the change log holds from an earlier drop: that
        # column keeps it. Renamed along with ``c3`` to ``r12``, it met ``c3``'s values
        # under one name and the batch failed on every rerun (seed 17302).
        finals = {self.final(i) for i in range(len(self.names))}
        passed = {
            n
            for idents in self.versions
            for i in idents
            for n in self.names[i][:-1]
            if n not in self.prior and n not in finals and n not in self.ghosts
        }
        for name in sorted(passed):
            if name in log_columns():
                self.ghosts[name] = self._new(name)

    def renames(self) -> dict[str, str]:
        """Every earlier name of a column → its latest, looked up once (never chained); the
        lake's own names decide where a name meant two columns."""
        out: dict[str, str] = {}
        for ident, names in enumerate(self.names):
            for name in names[:-1]:
                if name != self.final(ident):
                    out[name] = self.final(ident)
        for name, ident in [*self.prior.items(), *self.ghosts.items()]:
            if self.final(ident) != name:
                out[name] = self.final(ident)
            else:
                out.pop(name, None)
        return out


def build_catalogs(
    relations: Iterable[tuple[int, Relation]],
    types: Iterable[tuple[int, Type]],
    prior_schemas: dict[str, list[tuple[str, str]]] | None = None,
    column_ids: Mapping[str, ColumnIds] | None = None,
    log_columns: Callable[[str], Mapping[str, str]] | None = None,
) -> dict[str, TableCatalog]:
    """Table catalogs from the (seq, message) pairs of a batch, in peek order.

    ``prior_schemas`` are the state columns (name, ddl) of each table in the lake before
    this batch: a rename or type change between two batches follows the same rules as one
    inside a batch. ``column_ids``: each table's attnums before and after the batch, which
    tell renames from drops and adds (:func:`_renames`). ``log_columns``: the columns
    a table's change log has (name → type, top level and old image), asked only when a
    batch adds or renames a column (:meth:`_Lineage.settle`).
    """
    type_list = sorted(types, key=lambda p: p[0])
    prior_schemas = prior_schemas or {}
    catalogs: dict[str, TableCatalog] = {}
    lineages: dict[str, _Lineage] = {}
    previous: dict[str, list[tuple[str, str]]] = {k: list(v) for k, v in prior_schemas.items()}
    previous_seq: dict[str, int] = {}
    previous_oid: dict[str, int | None] = {
        n: ids.oid_before for n, ids in (column_ids or {}).items()
    }
    for seq, rel in sorted(relations, key=lambda p: p[0]):
        tname = table_name(rel)
        cat = catalogs.setdefault(tname, TableCatalog(name=tname))
        lineage = lineages.get(tname)
        if lineage is None:
            lineage = lineages[tname] = _Lineage.of(prior_schemas.get(tname, []))
        type_names = {t.oid: (t.namespace, t.name) for s, t in type_list if s < seq}
        ddls = [resolve_type(c.type_oid, c.typmod, type_names).spark_ddl for c in rel.columns]
        shape = [(c.name, ddl) for c, ddl in zip(rel.columns, ddls, strict=True)]
        renamed: dict[str, str] = {}
        fresh: frozenset[str] = frozenset()
        if tname in previous:
            if another_relation(previous_oid.get(tname), rel.oid):
                # Dropped and created again under the name: another table, whose columns
                # are all new (neither names nor attnums relate the two); a same-named
                # one shares the change log's column only where its type widens to it.
                fresh = frozenset(c.name for c in rel.columns)
            else:
                ids = (column_ids or {}).get(tname)
                prev_seq = previous_seq.get(tname, -1)
                renamed, fresh = _renames(
                    previous[tname], shape, ids, lineage.origin, prev_seq, seq
                )
        lineage.step([c.name for c in rel.columns], renamed, fresh)
        previous[tname], previous_seq[tname], previous_oid[tname] = shape, seq, rel.oid
        cat.versions.append(
            RelationVersion(
                seq=seq,
                oid=rel.oid,
                replica_identity=rel.replica_identity,
                columns=tuple(
                    ColumnSpec(c.name, c.type_oid, c.typmod, ddl)
                    for c, ddl in zip(rel.columns, ddls, strict=True)
                ),
                key_columns=tuple(c.name for c in rel.columns if c.is_key),
                type_names=tuple(sorted((o, ns, nm) for o, (ns, nm) in type_names.items())),
            )
        )
    for cat in catalogs.values():
        logged = functools.partial(log_columns, cat.name) if log_columns is not None else dict
        _resolve_columns(cat, prior_schemas.get(cat.name, []), lineages[cat.name], logged)
    _split_shared_oids(catalogs)
    return catalogs


# Past every seq of a batch (TARGET_SEQ included): an open upper bound.
END_SEQ = 1 << 62


def _holders(catalogs: Mapping[str, TableCatalog]) -> dict[int, list[tuple[int, str]]]:
    """Each relation oid's Relation messages of the batch: (seq, table name), in order."""
    holders: dict[int, list[tuple[int, str]]] = {}
    for cat in catalogs.values():
        for v in cat.versions:
            holders.setdefault(v.oid, []).append((v.seq, cat.name))
    for named in holders.values():
        named.sort()
    return holders


def _split_shared_oids(catalogs: Mapping[str, TableCatalog]) -> None:
    """Give each table its seq ranges of a relation oid that several tables of the batch
    named (``TableCatalog.shared``). A receiver keeps the latest Relation message of each
    oid and reads a change by it, so a change belongs to the name that message carried:
    ``INSERT`` into ``t``, ``RENAME t TO t2``, ``UPDATE t2`` gives the insert to ``t`` and
    the update to ``t2``, though both have ``t``'s oid."""
    for oid, named in _holders(catalogs).items():
        if len({name for _, name in named}) < 2:
            continue
        spans: dict[str, list[tuple[int, int]]] = {}
        for i, (seq, name) in enumerate(named):
            if i and named[i - 1][1] == name:
                continue  # the same name's next version: its span goes on
            after = seq if i else -1
            before = next((s for s, n in named[i + 1 :] if n != name), END_SEQ)
            spans.setdefault(name, []).append((after, before))
        for name, ranges in spans.items():
            catalogs[name].shared[oid] = tuple(ranges)


@dataclass(frozen=True)
class RelationChange:
    """A name of a batch that began to read another relation's rows than before: its
    rows up to there are elsewhere (the dropped table's, or the other name's), so only a
    copy of that relation has the table whole."""

    reason: str  # "recreated (oid A → B)" or "renamed from schema.table"
    oid: int  # the relation the name reads from there


def relation_changes(
    catalogs: Mapping[str, TableCatalog],
    lake_oids: Mapping[str, int | None],
    target_names: Mapping[int, str] | None = None,
) -> dict[str, RelationChange]:
    """Each table whose relation changed in the batch: dropped and created again (another
    oid than its previous version's, or than ``lake_oids``, the one the lake last wrote it
    from), or whose relation had changes under another name (renamed to it, or renamed
    away and back), which went to that name's tables. ``target_names``: the name of each
    relation oid at the batch's target (:func:`slotlake.ddl.read_catalog`); without it, a
    table is known renamed only by a Relation message of its own after the other name's.
    """
    holders = _holders(catalogs)
    out: dict[str, RelationChange] = {}
    for cat in catalogs.values():
        before = lake_oids.get(cat.name)
        for v in sorted(cat.versions, key=lambda v: v.seq):
            named = holders[v.oid]
            at = bisect.bisect_left(named, (v.seq, ""))
            if another_relation(before, v.oid):
                out[cat.name] = RelationChange(f"recreated (oid {before} → {v.oid})", v.oid)
            elif at and named[at - 1][1] != cat.name and target_names is None:
                out[cat.name] = RelationChange(f"renamed from {named[at - 1][1]}", v.oid)
            before = v.oid
    for oid, named in holders.items() if target_names is not None else ():
        final = target_names.get(oid)
        others = [name for _, name in named if name != final]
        if final is not None and others and final not in out:
            out[final] = RelationChange(f"renamed from {others[-1]}", oid)
    return out


# Where a table's shape at the batch's target goes in the batch (after every payload of
# it): its Type messages, then its Relation message.
TARGET_SEQ = 1 << 61


@dataclass(frozen=True)
class TargetRelation:
    """A table as pgoutput would describe it at the batch's target (read from the catalog
    with the target LSN): its Relation message (xid None) and the Type messages of its
    user-defined column types."""

    relation: Relation
    types: tuple[Type, ...] = ()

    def to_json(self) -> dict[str, object]:
        r = self.relation
        return {
            "oid": r.oid,
            "namespace": r.namespace,
            "name": r.name,
            "replica_identity": r.replica_identity,
            "columns": [[c.flags, c.name, c.type_oid, c.typmod] for c in r.columns],
            "types": [[t.oid, t.namespace, t.name] for t in self.types],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, object]) -> TargetRelation:
        columns = tuple(
            RelationColumn(int(f), str(n), int(o), int(m))
            for f, n, o, m in obj["columns"]  # type: ignore[attr-defined]
        )
        relation = Relation(
            None,
            int(obj["oid"]),  # type: ignore[call-overload]
            str(obj["namespace"]),
            str(obj["name"]),
            str(obj["replica_identity"]),
            columns,
        )
        types = tuple(
            Type(None, int(o), str(ns), str(n))
            for o, ns, n in obj.get("types", [])  # type: ignore[attr-defined]
        )
        return cls(relation, types)


def _columns(rel: Relation) -> tuple[tuple[str, int, int], ...]:
    # Keys are not compared: an identity changed after a table's last change matters only
    # to its next change, whose own Relation message brings it.
    return tuple((c.name, c.type_oid, c.typmod) for c in rel.columns)


def target_versions(
    relations: Iterable[tuple[int, Relation]],
    at_target: Mapping[str, TargetRelation],
    target_attnums: Mapping[str, Mapping[str, int]],
    lake_tables: Mapping[str, tuple[Sequence[str], Mapping[str, int]]],
    lake_oids: Mapping[str, int | None] | None = None,
) -> list[tuple[int, Relation | Type]]:
    """The Relation (and Type) messages that bring each table to its shape at the batch's
    target, where the batch's own do not.

    pgoutput describes a table only before a change of it: a column added, renamed or
    dropped after the table's last change of the batch (or in a batch without any) would
    otherwise reach the state only with the table's next change — its older rows missing
    a fast default's value, a renamed column's values under the old name. A table gets a
    version at :data:`TARGET_SEQ` when its latest Relation message of the batch differs
    from its shape at the target in its columns' names, types or order, or is another
    relation's (dropped and created again after its last change: the state ends in the
    new relation's columns, as the copy the run takes of it has them, and the batch
    records the new oid), or, with none in the batch,
    when the lake's columns of it (``lake_tables``: state column names and attnums)
    differ from the target's by name or attnum (a type alone is not compared there: the
    lake may keep a column as text), or the lake wrote it from another relation
    (``lake_oids``: a table dropped and created again, whose columns are new ones even
    under the same names and attnums).
    """
    latest: dict[str, Relation] = {}
    for _, rel in sorted(relations, key=lambda p: p[0]):
        latest[table_name(rel)] = rel
    out: list[tuple[int, Relation | Type]] = []
    for name, target in sorted(at_target.items()):
        rel = target.relation
        if name in latest:
            seen = latest[name]
            if seen.oid == rel.oid and _columns(seen) == _columns(rel):
                continue
        elif name in lake_tables:
            names, attnums = lake_tables[name]
            if another_relation((lake_oids or {}).get(name), rel.oid):
                out += [(TARGET_SEQ - 1, t) for t in target.types]
                out.append((TARGET_SEQ, rel))
                continue
            published = [c.name for c in rel.columns]
            ids = target_attnums.get(name, {})
            renumbered = bool(attnums) and any(
                attnums.get(n) is not None and attnums.get(n) != ids.get(n) for n in published
            )
            if set(published) == set(names) and not renumbered:
                continue
        else:
            continue
        out += [(TARGET_SEQ - 1, t) for t in target.types]
        out.append((TARGET_SEQ, rel))
    return out


def _resolve_columns(
    cat: TableCatalog,
    prior: list[tuple[str, str]],
    lineage: _Lineage,
    logged: Callable[[], Mapping[str, str]] = dict,
) -> None:
    types: dict[int, list[str]] = {}
    for name, ddl in prior:
        types.setdefault(lineage.prior[name], []).append(ddl)
    for v, idents in zip(cat.versions, lineage.versions, strict=True):
        for c, ident in zip(v.columns, idents, strict=True):
            types.setdefault(ident, []).append(c.spark_ddl)
    lineage.settle(logged, types)
    for ident in lineage.versions[-1]:
        name = lineage.final(ident)
        if ident in lineage.added and any(
            lineage.final(other) == name and other != ident
            for idents in [list(lineage.prior.values()), *lineage.versions]
            for other in idents
        ):
            first = next(i for i, idents in enumerate(lineage.versions) if ident in idents)
            cat.readded_at[name] = cat.versions[first].seq
    latest = cat.versions[-1]
    cat.replica_identity = latest.replica_identity
    cat.key_columns = list(latest.key_columns)
    cat.state_columns = [c.name for c in latest.columns]
    cat.renames = lineage.renames()
    cat.lake_names = {
        lineage.final(ident): name
        for name, ident in lineage.prior.items()
        if lineage.final(ident) != name
    }
    # Each version's names → the output names of its columns.
    outputs = [
        {c.name: lineage.final(i) for c, i in zip(v.columns, idents, strict=True)}
        for v, idents in zip(cat.versions, lineage.versions, strict=True)
    ]
    # Every type each output column has had, in order: prior lake schema first.
    history: dict[str, list[str]] = {}
    order: list[str] = []
    for name, ddl in prior:
        history.setdefault(lineage.final(lineage.prior[name]), []).append(ddl)
    for v, out in zip(cat.versions, outputs, strict=True):
        for c in v.columns:
            history.setdefault(out[c.name], []).append(c.spark_ddl)
    for c in latest.columns:
        order.append(c.name)
    for name in history:
        if name not in order:
            order.append(name)
    # Versions shape rows with output names, so renames resolve at decode time.
    versions = []
    for v, out in zip(cat.versions, outputs, strict=True):
        versions.append(
            RelationVersion(
                seq=v.seq,
                oid=v.oid,
                replica_identity=v.replica_identity,
                columns=tuple(
                    ColumnSpec(out[c.name], c.type_oid, c.typmod, c.spark_ddl) for c in v.columns
                ),
                key_columns=tuple(out[k] for k in v.key_columns),
                type_names=v.type_names,
            )
        )
    cat.versions = versions
    columns = []
    for name in order:
        final = final_type(history[name])
        if final != history[name][-1]:
            cat.text_columns.add(name)
        columns.append((name, final))
    cat.columns = columns
