"""Job configuration: TOML files in conf/, overridden by ``--set key=value``.

Secrets never live here: the DSN follows libpq conventions and takes its password from
PGPASSWORD, ~/.pgpass or a service file. A DSN that carries a password is refused.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from slotlake.redact import describe_dsn, redact_dsn


class ConfigError(ValueError):
    pass


@dataclass
class SourceConfig:
    dsn: str = ""
    slot: str = "slotlake"
    publications: list[str] = field(default_factory=lambda: ["slotlake"])
    proto_version: int = 1
    binary: bool = False
    messages: bool = False
    streaming: bool = False
    # Ask pgoutput for messages so the DDL capture trigger's (slotlake.ddl) reach the
    # batch; bootstrap installs the trigger when it can (see `slotlake capture-ddl`).
    capture_ddl: bool = True
    # Session settings for the peek (e.g. logical_decoding_work_mem); never secrets.
    settings: dict[str, str] = field(default_factory=dict)
    # A pull over at least this many MiB of WAL runs as two peeks decoded at once, the
    # second from a temporary copy of the slot (needs a free replication slot; not with
    # streaming). 0: always one peek.
    split_peek_mb: float = 64.0
    # A pull over less WAL than this many MiB reads on the session's own connection, not
    # ADBC's (whose connection loads the database's type catalog first). 0: always ADBC.
    adbc_min_mb: float = 32.0
    # Before reading each batch's target, have the server log its running transactions
    # (pg_log_standby_snapshot(), PostgreSQL 16 on a primary, when the role may execute
    # it) so the slot's restart point follows the batches: see SlotSource.log_restart_point.
    log_snapshots: bool = True

    @property
    def pulls_messages(self) -> bool:
        """Whether the peek asks pgoutput for messages: the DDL capture's ride on them."""
        return self.messages or self.capture_ddl


@dataclass
class LakeConfig:
    path: str = "lake"
    # Raw batches kept for reprocessing: the newest N committed batches (-1 = all).
    raw_retention_batches: int = -1
    # Commit records kept by `slotlake maintain`: the newest N (-1 = all), never those of
    # batches still readable (state_versions) or with raw kept, nor the one before them.
    commit_retention_batches: int = -1
    # Batches back whose Delta table versions stay readable (time travel, reprocessing
    # start points): `slotlake maintain` never VACUUMs files those versions still use.
    state_versions: int = 3
    # `slotlake maintain` also keeps every file removed less than this many hours ago
    # (readers in flight, pinned to a version that has since left the window above).
    vacuum_min_age_hours: int = 24
    # Tables of one batch written at once (threads over one SparkContext).
    table_workers: int = 4
    # Worker processes (forked) for a batch's tables done wholly on the driver, when it
    # has at least 16 of them; "auto" (the default): one a core; 0: threads only.
    table_processes: int | None = None
    # A table whose batch has at most this many rows is done on the driver (decode,
    # TOAST fill, change log: no Spark job), as long as all such tables' payloads stay
    # within driver_write_mb MiB; its state is merged by `deltalake` up to
    # driver_write_state_mb MiB (a multiset's rebuilt whole and overwritten), above that
    # a keyed state is MERGEd by the driver writing deletion vectors
    # (driver_deletion_vectors; false: by Spark's MERGE), a multiset wholly by Spark.
    # 0 rows sends every table through Spark. None ("auto", the default): sized from the
    # memory this process may use (slotlake.batch.DriverWrites.of).
    driver_write_rows: int | None = None
    driver_write_mb: int | None = None
    driver_write_state_mb: int = 64
    driver_deletion_vectors: bool = True
    # `slotlake bootstrap` on a local lake: a published table of at most this many MiB on
    # disk (heap and TOAST) that is not split into ranges is copied on the driver and
    # written with `deltalake`, several at once; a bigger keyed table is streamed on the
    # driver (its ranges at once); a bigger multiset (grouped whole) goes through Spark
    # tasks over parallel ranges. 0 sends every table through Spark.
    bootstrap_driver_mb: int = 64
    # A sync's batch on a local lake fsyncs what it wrote by name up to this many files;
    # more, and it syncs the lake's file system whole (one syncfs: a batch of a hundred
    # small tables writes 400 files). Raise it for a lake whose file system a busy
    # writer shares (a database's dirty pages would be flushed with the lake's).
    fsync_files_max: int = 64
    # A batch whose commit names tables for a copy it could not take itself (their
    # relation changed inside it, or a rewrite it found: `snapshot.wanted`), or after
    # which the source needs one (changed while the run read it: `snapshot.due`), is
    # followed, in the same run, by one more batch that takes them, so the run ends with
    # those tables equal to the source instead of leaving them to the next run. Not with
    # --target-lsn (the copy would be newer than the target).
    copy_wanted_in_same_run: bool = True


@dataclass
class Config:
    source: SourceConfig = field(default_factory=SourceConfig)
    lake: LakeConfig = field(default_factory=LakeConfig)
    spark: dict[str, str] = field(default_factory=dict)
    accept_slot_ahead: bool = False

    def describe(self) -> str:
        return (
            f"slot {self.source.slot} on {describe_dsn(self.source.dsn)} "
            f"(publications {', '.join(self.source.publications)}) → {self.lake.path}"
        )


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = _parse_value(value.strip())
    return out


# Settings whose default is worked out at run time; "auto" asks for it explicitly.
AUTO_SETTINGS = {
    ("lake", "driver_write_rows"),
    ("lake", "driver_write_mb"),
    ("lake", "table_processes"),
}


def _apply(target: Any, section: str, values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        if not hasattr(target, key):
            raise ConfigError(f"unknown configuration key {section}.{key}")
        if (section, key) in AUTO_SETTINGS:
            if value != "auto" and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f'{section}.{key} must be an integer or "auto", got {value!r}')
            setattr(target, key, None if value == "auto" else value)
            continue
        current = getattr(target, key)
        if isinstance(current, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{section}.{key} must be true or false, got {value!r}")
        elif isinstance(current, int) and not isinstance(value, int):
            raise ConfigError(f"{section}.{key} must be an integer, got {value!r}")
        elif isinstance(current, float):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{section}.{key} must be a number, got {value!r}")
            value = float(value)
        elif isinstance(current, list):
            # "a,b" (as --set source.publications=a,b reads) is two names; a TOML list
            # keeps a name with a comma whole.
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            else:
                value = list(value)
        elif isinstance(current, dict):
            value = {str(k): str(v) for k, v in dict(value).items()}
        setattr(target, key, value)


def load_config(path: str | Path | None, overrides: Mapping[str, Any] | None = None) -> Config:
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"configuration file {path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        if not key:
            raise ConfigError(f"override {dotted!r} must be section.key")
        raw.setdefault(section, {})[key] = value
    cfg = Config()
    for section, values in raw.items():
        if section == "source":
            _apply(cfg.source, "source", values)
        elif section == "lake":
            _apply(cfg.lake, "lake", values)
        elif section == "spark":
            cfg.spark.update({str(k): str(v) for k, v in values.items()})
        elif section == "sync":
            _apply(cfg, "sync", values)
        else:
            raise ConfigError(f"unknown configuration section [{section}]")
    validate(cfg)
    return cfg


_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")


def validate(cfg: Config) -> None:
    src = cfg.source
    if "password" in src.dsn.lower() or _uri_has_password(src.dsn):
        raise ConfigError(
            "source.dsn must not carry a password: use PGPASSWORD, ~/.pgpass or a service file "
            f"(got {redact_dsn(src.dsn)})"
        )
    if src.proto_version not in (1, 2, 3, 4):
        raise ConfigError(f"source.proto_version must be 1 to 4, got {src.proto_version}")
    if src.streaming and src.proto_version < 2:
        raise ConfigError("source.streaming needs source.proto_version >= 2")
    if not src.publications:
        raise ConfigError("source.publications must name at least one publication")
    if not src.slot:
        raise ConfigError("source.slot must be set")
    if not _SLOT_NAME.fullmatch(src.slot):
        # PostgreSQL's own rule (ReplicationSlotValidateName): said here, before a sync
        # reports the slot missing and suggests creating a name the server refuses.
        raise ConfigError(
            "source.slot must be 1 to 63 lowercase letters, digits and underscores "
            f"(PostgreSQL's rule for slot names), got {src.slot!r}"
        )
    for name in ("split_peek_mb", "adbc_min_mb"):
        if getattr(src, name) < 0:
            raise ConfigError(f"source.{name} must be 0 (off) or more, got {getattr(src, name)}")
    lake = cfg.lake
    # (setting, smallest value that means something): a negative bound would silently
    # send every table one way, or keep nothing.
    for name, least in (
        ("raw_retention_batches", -1),
        ("commit_retention_batches", -1),
        ("state_versions", 0),  # 0 keeps the newest batch, as 1 does
        ("vacuum_min_age_hours", 0),
        ("table_workers", 1),
        ("table_processes", 0),
        ("driver_write_rows", 0),
        ("driver_write_mb", 0),
        ("driver_write_state_mb", 0),
        ("bootstrap_driver_mb", 0),
        ("fsync_files_max", 0),
    ):
        value = getattr(lake, name)
        if value is not None and value < least:
            raise ConfigError(f"lake.{name} must be {least} or more, got {value}")


def _uri_has_password(dsn: str) -> bool:
    if "://" not in dsn:
        return False
    netloc = dsn.split("://", 1)[1].split("/", 1)[0]
    return "@" in netloc and ":" in netloc.split("@", 1)[0]
