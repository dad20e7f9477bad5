"""The ``slotlake`` command and its subcommands.

Each subcommand parses its arguments, builds what it needs and calls the library; the
spark-submit entry points in jobs/ call the same functions.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from slotlake import __version__
from slotlake.config import Config, ConfigError, load_config, parse_overrides
from slotlake.lake import NotALakeError, OldLayoutError, TableCommit
from slotlake.lsn import Lsn
from slotlake.memory import prefer_jemalloc
from slotlake.redact import describe_dsn, redact_dsn

log = logging.getLogger("slotlake")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # py4j and Spark's Python side are chatty at INFO.
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="TOML configuration file (see conf/example.toml)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a configuration key, e.g. --set source.slot=other (repeatable)",
    )


def load(args: argparse.Namespace) -> Config:
    return load_config(args.config, parse_overrides(args.overrides))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slotlake",
        description="Mirror a PostgreSQL logical replication slot (pgoutput) into Delta Lake "
        "tables, one batch at a time: a change log and a state per published table.",
        epilog="Each command but demo takes --config FILE (TOML; see conf/example.toml) and --set "
        "KEY=VALUE overrides. Connections follow libpq: PGPASSWORD, ~/.pgpass, service files.",
    )
    parser.add_argument("--version", action="version", version=f"slotlake {__version__}")
    parser.add_argument("--verbose", "-v", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "sync",
        help="pull the slot up to a target LSN into the lake (one batch, and one more when it "
        "names tables for a copy)",
    )
    _config_args(p)
    p.add_argument(
        "--target-lsn",
        type=Lsn.parse,
        help="pull up to this LSN (default, and at most: the source's flush LSN)",
    )
    p.add_argument(
        "--accept-slot-ahead",
        action="store_true",
        help="continue when the slot is ahead of the lake (accepts the loss of the changes in between)",
    )

    p = sub.add_parser(
        "resnapshot",
        help="have the next sync copy one table again, consistently with the stream (repair)",
    )
    _config_args(p)
    p.add_argument("--table", required=True, help="schema.table, as published")

    p = sub.add_parser("status", help="slot state, last committed batch, per-table row counts")
    _config_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("inspect", help="print decoded messages of a raw batch or of a live peek")
    _config_args(p)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--raw", help="a raw batch directory or Parquet file")
    where.add_argument("--batch", type=int, help="the raw batch of committed batch N in the lake")
    where.add_argument("--live", action="store_true", help="peek the slot (never consumes)")
    p.add_argument("--limit", type=int, default=0, help="stop after N messages (0 = all)")

    p = sub.add_parser(
        "reprocess",
        help="rebuild committed batches from their raw Parquet (no PostgreSQL, slot untouched)",
    )
    _config_args(p)
    dest = p.add_mutually_exclusive_group(required=True)
    dest.add_argument("--output", help="a new lake root to write the rebuilt batches to")
    dest.add_argument(
        "--in-place",
        action="store_true",
        help="replace the lake's outputs, atomically batch by batch (pause sync meanwhile)",
    )
    p.add_argument(
        "--batches", metavar="FIRST..LAST", help="range of committed batches (default: all)"
    )
    p.add_argument(
        "--from-empty",
        action="store_true",
        help="start from empty tables instead of the state committed before FIRST",
    )

    p = sub.add_parser(
        "bootstrap", help="create the slot and copy every published table into the lake"
    )
    _config_args(p)
    from slotlake.bootstrap import add_arguments as add_bootstrap_arguments

    add_bootstrap_arguments(p)

    p = sub.add_parser(
        "capture-ddl",
        help="install (or --drop) the DDL capture event trigger on the source (superuser)",
    )
    _config_args(p)
    p.add_argument("--drop", action="store_true", help="remove the trigger and its function")

    p = sub.add_parser(
        "maintain",
        help="OPTIMIZE and VACUUM the lake's Delta tables (keeping lake.state_versions "
        "batches readable), expire raw batches; under the slot's lock",
    )
    _config_args(p)

    p = sub.add_parser("demo", help="throwaway PostgreSQL + workload + several sync batches")
    p.add_argument("--lake", default=None, help="lake directory (default: a temporary one)")
    p.add_argument(
        "--pg-version",
        type=int,
        choices=(15, 16),
        default=None,
        help="15 or 16 (default: newest found)",
    )
    p.add_argument("--rows", type=_positive, default=2000, help="rows per sample table")
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    prefer_jemalloc()
    try:
        if args.command == "sync":
            return cmd_sync(args)
        if args.command == "status":
            return cmd_status(args)
        if args.command == "resnapshot":
            return cmd_resnapshot(args)
        if args.command == "inspect":
            return cmd_inspect(args)
        if args.command == "reprocess":
            return cmd_reprocess(args)
        if args.command == "bootstrap":
            from slotlake.bootstrap import run_from_args

            return run_from_args(args, load(args))
        if args.command == "maintain":
            return cmd_maintain(args)
        if args.command == "capture-ddl":
            return cmd_capture_ddl(args)
        if args.command == "demo":
            from slotlake.demo import run_demo

            return run_demo(lake=args.lake, pg_version=args.pg_version, rows=args.rows)
    except ConfigError as exc:
        print(f"slotlake: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OldLayoutError, NotALakeError) as exc:
        # A lake of slotlake's Parquet layout (before Delta Lake), or a lake.path that is no
        # lake: a usage error, not a crash.
        print(f"slotlake {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("slotlake: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.verbose:
            log.exception("failed")
        print(f"slotlake {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


def cmd_sync(args: argparse.Namespace) -> int:
    from slotlake.sync import run_sync

    cfg = load(args)
    log.info("sync: %s", cfg.describe())
    result = run_sync(
        cfg, target_lsn=args.target_lsn, accept_slot_ahead=args.accept_slot_ahead or None
    )
    for name, (changes, _) in sorted(result.tables.items()):
        print(f"{name}: {changes} changes, {result.state_rows_text[name]}")
    if result.followed is not None:
        print(f"batch {result.followed} named tables for a copy, which batch {result.batch} took")
    print(
        f"status: {result.status}"
        + (f", batch {result.batch}, slot at {result.end_lsn}" if result.batch else "")
    )
    return EXIT_OK


def cmd_resnapshot(args: argparse.Namespace) -> int:
    """Record a request the next sync honours (no lock needed: sync reads it at its start)."""
    import psycopg

    from slotlake.lake import Lake
    from slotlake.snapshot import published_tables, request

    cfg = load(args)
    lake = Lake(cfg.lake.path)
    lake.layout()
    if lake.last_commit() is None:
        print(
            f"slotlake resnapshot: lake {cfg.lake.path} has no committed batch: start it with "
            "`slotlake bootstrap`, which copies every published table",
            file=sys.stderr,
        )
        return EXIT_ERROR
    with psycopg.connect(cfg.source.dsn, autocommit=True, application_name="slotlake") as conn:
        published = published_tables(conn, cfg.source.publications)
    if args.table not in published:
        print(
            f"slotlake resnapshot: table {args.table} is not published by "
            f"{', '.join(cfg.source.publications)} (published: {', '.join(sorted(published)) or 'none'})",
            file=sys.stderr,
        )
        return EXIT_ERROR
    entry = request(lake, args.table)
    print(
        f"status: requested, {args.table} is copied again by the next sync (one running now "
        f"may take it in one more batch; request {entry['id']})"
    )
    return EXIT_OK


def cmd_reprocess(args: argparse.Namespace) -> int:
    from slotlake.reprocess import parse_range, run_reprocess

    cfg = load(args)
    try:
        first, last = parse_range(args.batches)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    result = run_reprocess(
        cfg.lake.path,
        output=args.output,
        first=first,
        last=last,
        in_place=args.in_place,
        from_empty=args.from_empty,
        spark_conf=cfg.spark,
    )
    for batch, tables in sorted(result.tables.items()):
        texts = result.state_rows_text[batch]
        for name, (changes, _) in sorted(tables.items()):
            print(f"batch {batch}: {name}: {changes} changes, {texts[name]}")
    span = f"{result.batches[0]}..{result.batches[-1]}" if result.batches else "none"
    start = (
        f"the state of batch {result.from_batch_state}"
        if result.from_batch_state
        else "empty tables"
    )
    print(f"status: reprocessed batches {span} from {start} into {result.output}")
    return EXIT_OK


def _table_status(t: TableCommit) -> dict[str, object]:
    return {
        "state_rows": t.state_rows,
        "changes_in_last_batch": t.change_rows,
        "missing_toast_in_last_batch": t.missing_toast,
        "state_version": t.state_version,
        "changes_version": t.changes_version,
        "state": t.state,
        "changes": t.changes,
        "multiset": t.multiset,
        "multiset_spread": t.spread,
        "unique_on": t.unique_on,
        "written_in_last_batch": t.written,
        "gone_since": t.gone_since,
    }


def cmd_status(args: argparse.Namespace) -> int:
    from slotlake.lake import Lake
    from slotlake.sync import open_source

    cfg = load(args)
    lake = Lake(cfg.lake.path)
    # The lake first: one of the old layout is refused before the source is asked anything.
    layout = lake.layout()
    last = lake.last_commit()
    out: dict[str, object] = {
        "slot": cfg.source.slot,
        "source": redact_dsn(cfg.source.dsn),
        "lake": cfg.lake.path,
        "lake_id": layout.get("lake_id") if layout else None,
    }
    from slotlake import snapshot
    from slotlake.source import SourceError

    # A source that cannot be reached (down, a wrong DSN) still gets the lake's status:
    # what was committed is what an operator needs first. The run fails (exit 1) so that
    # a scheduler's check notices.
    unreachable: str | None = None
    info = None
    holder = user = None
    published: snapshot.Published | None = None
    try:
        with open_source(cfg, "status") as source:
            info = source.slot_info()
            holder = source.lock_holder()
            if info is not None and info.active and info.active_pid is not None:
                user = source.backend(info.active_pid)
    except SourceError as exc:
        unreachable = str(exc)
    if unreachable is None:
        try:
            import psycopg

            with psycopg.connect(
                cfg.source.dsn, autocommit=True, application_name="slotlake"
            ) as conn:
                published = snapshot.published_catalog(conn, cfg.source.publications, last)
        except Exception as exc:  # status must still show the lake
            log.warning("could not read the published tables: %s", exc)
    out["source_error"] = unreachable
    # A sync, bootstrap or maintain running now (or a session a vanished one left behind).
    out["lock_held_by"] = holder._asdict() if holder is not None else None
    in_progress = snapshot.read_progress(lake)
    plan = lake.read_plan(last.batch + 1 if last else 1)
    if plan is not None:
        for name, t in plan.snapshot.get("tables", {}).items():
            in_progress.setdefault(name, {"batch": plan.batch, "reason": t["reason"]})
            in_progress[name].update(state="copied, batch unfinished", rows=t["rows"])
    out["snapshots"] = {
        "waiting": {
            k: v for k, v in snapshot.waiting(lake, published).items() if k not in in_progress
        },
        "in_progress": in_progress,
    }
    if info is None:
        out["slot_state"] = None
    else:
        out["slot_state"] = {
            "confirmed_flush_lsn": str(info.confirmed_flush_lsn)
            if info.confirmed_flush_lsn is not None
            else None,
            "restart_lsn": str(info.restart_lsn) if info.restart_lsn is not None else None,
            "retained_wal_bytes": info.retained_bytes,
            "wal_status": info.wal_status,
            "active": info.active,
            # The session peeking or streaming from it now.
            "active_by": user._asdict() if user is not None else None,
        }
    if last is None:
        out["last_batch"] = None
    else:
        out["last_batch"] = {
            "batch": last.batch,
            "kind": last.kind,
            "created_at": last.created_at,
            "start_lsn": last.start_lsn,
            "end_lsn": last.end_lsn,
            "raw_messages": last.raw_messages,
            "transactions": last.transaction_count,
            "transactions_version": last.transactions_version,
            "messages_version": last.messages_version,
            "txn_app_id": last.txn_app_id,
            "timings": last.timings,
        }
        out["tables"] = {name: _table_status(t) for name, t in sorted(last.tables.items())}
    done = EXIT_OK if unreachable is None else EXIT_ERROR
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return done
    print(f"slot {cfg.source.slot} on {describe_dsn(cfg.source.dsn)}")
    st = out["slot_state"]
    if unreachable is not None:
        print(f"  slot: unknown, the source was not reached: {unreachable}")
    elif st is None:
        print("  slot: does not exist")
    else:
        assert isinstance(st, dict)
        print(
            f"  confirmed_flush {st['confirmed_flush_lsn']}  restart {st['restart_lsn']}  "
            f"wal retained {st['retained_wal_bytes']} bytes  wal_status {st['wal_status']}"
        )
    if user is not None:
        print(f"  slot in use by {user.describe()}")
    if holder is not None:
        print(f"  lock: held by {holder.describe()}")
    snaps = out["snapshots"]
    assert isinstance(snaps, dict)
    for name, reason in sorted(snaps["waiting"].items()):
        print(f"  snapshot waiting: {name} ({reason}): the next sync copies it")
    for name, p in sorted(snaps["in_progress"].items()):
        print(
            f"  snapshot in progress: {name} ({p.get('reason', '')}): {p.get('state', '')}, "
            f"{int(p.get('rows', 0)):,} rows copied (batch {p.get('batch')})"
        )
    if last is None:
        print(f"lake {cfg.lake.path}: no committed batch")
    else:
        print(
            f"lake {cfg.lake.path}: batch {last.batch} ({last.kind}) committed {last.created_at}, "
            f"{last.start_lsn}..{last.end_lsn}, {last.raw_messages} messages, {last.transaction_count} transactions"
        )
        for name, t in sorted(last.tables.items()):
            gone = (
                ""
                if t.gone_since is None
                else f"gone from the source since batch {t.gone_since}, last "
            )
            # Rows the lake never had (a lake begun by a plain sync keeps them so).
            missing = (
                f", {t.missing_toast} without an unchanged TOAST value" if t.missing_toast else ""
            )
            print(
                f"  {name}: {gone}{t.state_rows_text()} ({t.change_rows} changes in the last batch{missing}); "
                f"Delta state v{_version(t.state_version)}, changes v{_version(t.changes_version)}"
            )
    return done


def _version(v: int | None) -> str:
    return "-" if v is None else str(v)


def cmd_inspect(args: argparse.Namespace) -> int:
    from slotlake.inspect import RawPathError, inspect_live, inspect_raw

    if args.live:
        cfg = load(args)
        for line in inspect_live(cfg, limit=args.limit):
            print(line)
        return EXIT_OK
    if args.raw:
        path = args.raw
    else:
        from slotlake.lake import Lake

        cfg = load(args)
        lake = Lake(cfg.lake.path)
        lake.layout()  # OldLayoutError for a lake of the old layout
        if args.batch not in lake.commit_batches():
            why = (
                "had its record and raw payloads expired (lake.commit_retention_batches)"
                if args.batch <= lake.commits_expired_upto()
                else "is not committed"
            )
            print(f"slotlake inspect: batch {args.batch} {why} in {cfg.lake.path}", file=sys.stderr)
            return EXIT_USAGE
        rec = lake.read_commit(args.batch)
        if not rec.raw:
            print(
                f"slotlake inspect: batch {args.batch} is a {rec.kind} batch: it has no raw "
                "payloads (a bootstrap copies tables, it decodes no messages)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        if not lake.exists(rec.raw):
            print(
                f"slotlake inspect: the raw payloads of batch {args.batch} ({rec.raw}) are no "
                "longer kept (lake.raw_retention_batches)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        path = lake.path(rec.raw)
    try:
        for line in inspect_raw(path, limit=args.limit):
            print(line)
    except RawPathError as exc:  # raised before the first line: a usage error
        print(f"slotlake inspect: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def cmd_capture_ddl(args: argparse.Namespace) -> int:
    import psycopg

    from slotlake import ddl
    from slotlake.redact import dsn_password, redact_text

    cfg = load(args)
    where = describe_dsn(cfg.source.dsn)
    secrets = [p for p in (dsn_password(cfg.source.dsn),) if p]
    try:
        with psycopg.connect(cfg.source.dsn, autocommit=True, application_name="slotlake") as conn:
            if args.drop:
                removed = ddl.drop(conn)
                print(
                    f"DDL capture {'removed from' if removed else 'was not installed in'} {where}"
                )
            else:
                created = ddl.install(conn)
                state = "installed" if created else "already installed (function refreshed)"
                print(f"DDL capture {state} in {where}")
    except ddl.DdlCaptureError as exc:
        print(f"slotlake capture-ddl: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except psycopg.Error as exc:
        text = " ".join(str(exc).split())
        print(f"slotlake capture-ddl: on {where}: {redact_text(text, secrets)}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def cmd_maintain(args: argparse.Namespace) -> int:
    from slotlake.maintain import run_maintain

    cfg = load(args)
    log.info("maintain: %s", cfg.describe())
    # One line per table as it finishes, then the summary (stdout).
    run_maintain(cfg, progress=lambda line: print(line, flush=True))
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
