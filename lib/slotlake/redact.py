"""Keep secrets out of log lines and error messages.

slotlake's configuration never holds a password (libpq finds it in PGPASSWORD,
``~/.pgpass`` or a service file), but a user may still paste one into a DSN, and
libpq or psycopg may echo a connection string back in an error. Everything that
reaches a log or an exception goes through here first.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from urllib.parse import quote

MASK = "***"

_URI_PREFIX = re.compile(r"^\s*postgres(?:ql)?://", re.IGNORECASE)
# postgresql://user:secret@host — the userinfo password, wherever a URI appears.
_URI_USERINFO = re.compile(r"(postgres(?:ql)?://[^\s:/?#@]*):([^\s@/?#]*)@", re.IGNORECASE)
# ?password=secret / &password=secret in a URI query string; '&' ends the value there.
_URI_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#\s]*", re.IGNORECASE)
# password=secret / password = 'sec ret' in a key=value conninfo. A quoted value may
# hold spaces and backslash escapes (libpq rules); an unquoted one ends at whitespace.
_KV_PASSWORD = re.compile(
    r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s']\S*|(?=\s|$))", re.IGNORECASE
)


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (key=value or URI form)."""
    if _URI_PREFIX.match(dsn):
        out = _URI_USERINFO.sub(rf"\1:{MASK}@", dsn)
        return _URI_QUERY_PASSWORD.sub(rf"\1{MASK}", out)
    return _KV_PASSWORD.sub(rf"\1{MASK}", dsn)


def describe_dsn(dsn: str) -> str:
    """A DSN as messages name it: redacted, and an empty one (libpq takes everything from
    the ``PG*`` variables, a service file and its defaults) said so rather than shown as
    nothing ("cannot connect to : ...")."""
    if not dsn.strip():
        return "the libpq defaults (an empty source.dsn: PG* variables, service file)"
    return redact_dsn(dsn)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with the given secrets, PGPASSWORD and any embedded DSN password masked.

    Applied to free text (server errors, tracebacks), so it errs on masking too much:
    a ``password=`` anywhere loses everything up to the next whitespace.
    """
    candidates = {s for s in secrets if s}
    env_password = os.environ.get("PGPASSWORD")
    if env_password:
        candidates.add(env_password)
    # Longest first so that a secret containing another is masked whole.
    for secret in sorted(candidates, key=len, reverse=True):
        text = text.replace(secret, MASK)
        encoded = quote(secret, safe="")
        if encoded != secret:
            text = text.replace(encoded, MASK)
    text = _URI_USERINFO.sub(rf"\1:{MASK}@", text)
    text = _URI_QUERY_PASSWORD.sub(rf"\1{MASK}", text)
    return _KV_PASSWORD.sub(rf"\1{MASK}", text)


def dsn_password(dsn: str) -> str | None:
    """The password written in a DSN, if any — so callers can add it to ``secrets``."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        value = conninfo_to_dict(dsn).get("password")
    except Exception:
        # An unparsable DSN: fall back to the regexes alone; never fail while redacting.
        return None
    return str(value) if value else None
