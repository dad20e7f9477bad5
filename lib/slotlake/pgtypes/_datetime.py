"""date, timestamp, timestamptz, time, timetz and interval.

Binary datums count days or microseconds from 2000-01-01. Values Python cannot hold
(±infinity, BC, years past 9999) become a Fallback whose text is rendered exactly as
PostgreSQL prints it with DateStyle='ISO, YMD', TimeZone='UTC', IntervalStyle='iso_8601'.
"""

from __future__ import annotations

import re
import sys
from datetime import date, datetime, timedelta, timezone

import pyarrow as pa

from . import _vector as vec
from ._codec import INT32, INT64, Codec, Fallback, string_codec

UTC = timezone.utc
_USECS_PER_SEC = 1_000_000
_USECS_PER_MINUTE = 60 * _USECS_PER_SEC
_USECS_PER_HOUR = 60 * _USECS_PER_MINUTE
_USECS_PER_DAY = 24 * _USECS_PER_HOUR
_POSTGRES_EPOCH_JDATE = 2451545  # Julian day of 2000-01-01
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

_EPOCH_DATE = date(2000, 1, 1)
_EPOCH_ORDINAL = _EPOCH_DATE.toordinal()
_MIN_DAYS = date.min.toordinal() - _EPOCH_ORDINAL
_MAX_DAYS = date.max.toordinal() - _EPOCH_ORDINAL
_EPOCH_NAIVE = datetime(2000, 1, 1)
_EPOCH_UTC = datetime(2000, 1, 1, tzinfo=UTC)
_MIN_USECS = _MIN_DAYS * _USECS_PER_DAY
_MAX_USECS = (_MAX_DAYS + 1) * _USECS_PER_DAY - 1

# What PostgreSQL prints for dates Python cannot hold; anything else is malformed.
_DATE_FALLBACK = re.compile(r"-?infinity|\d{4,}-\d\d-\d\d(?: BC)?")
_TIMESTAMP_FALLBACK = re.compile(
    r"-?infinity|\d{4,}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})?(?: BC)?"
)
_TIMESTAMPTZ_FALLBACK = re.compile(
    r"-?infinity|\d{4,}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})?[+-]\d\d(?::\d\d){0,2}(?: BC)?"
)


def _tdiv(a: int, b: int) -> int:
    """C integer division (truncates toward zero), as PostgreSQL's arithmetic does."""
    q = abs(a) // b
    return q if a >= 0 else -q


def _j2date(jd: int) -> tuple[int, int, int]:
    """PostgreSQL's j2date: Julian day → proleptic Gregorian (year ≤ 0 means BC)."""
    julian = jd + 32044
    quad = julian // 146097
    extra = (julian - quad * 146097) * 4 + 3
    julian += 60 + quad * 3 + extra // 146097
    quad = julian // 1461
    julian -= quad * 1461
    y = julian * 4 // 1461
    julian = ((julian + 305) % 365 if y != 0 else (julian + 306) % 366) + 123
    y += quad * 4
    quad = julian * 2141 // 65536
    day = julian - 7834 * quad // 256
    month = (quad + 10) % 12 + 1
    return y - 4800, month, day


def _date_text(days: int) -> tuple[str, bool]:
    """'YYYY-MM-DD' of a day count from 2000-01-01, and whether it is BC."""
    year, month, day = _j2date(days + _POSTGRES_EPOCH_JDATE)
    bc = year <= 0
    return f"{1 - year if bc else year:04d}-{month:02d}-{day:02d}", bc


def _seconds_fraction(usecs: int) -> str:
    # AppendSeconds: microseconds with trailing zeros dropped, nothing when zero.
    return f".{usecs:06d}".rstrip("0") if usecs else ""


def _clock_text(usecs: int) -> str:
    hours, rest = divmod(usecs, _USECS_PER_HOUR)
    minutes, rest = divmod(rest, _USECS_PER_MINUTE)
    seconds, fraction = divmod(rest, _USECS_PER_SEC)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{_seconds_fraction(fraction)}"


def _zone_text(zone_west: int) -> str:
    """EncodeTimezone: PostgreSQL stores seconds *west* of UTC, so the sign flips."""
    seconds = abs(zone_west)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    sign = "+" if zone_west <= 0 else "-"
    if seconds:
        return f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
    if minutes:
        return f"{sign}{hours:02d}:{minutes:02d}"
    return f"{sign}{hours:02d}"


# --- date ---------------------------------------------------------------------------


def _date_binary_text(value: bytes) -> str:
    days = INT32.unpack(value)[0]
    if days == _INT32_MAX:
        return "infinity"
    if days == _INT32_MIN:
        return "-infinity"
    text, bc = _date_text(days)
    return text + " BC" if bc else text


_fromisoformat_date = date.fromisoformat


def _date_from_text(value: str) -> object:
    if len(value) == 10 and value[4] == "-":
        return _fromisoformat_date(value)
    if _DATE_FALLBACK.fullmatch(value):
        return Fallback(value)
    raise ValueError("not an ISO date")


def _date_from_binary(value: bytes) -> object:
    days = INT32.unpack(value)[0]
    if _MIN_DAYS <= days <= _MAX_DAYS:
        return date.fromordinal(days + _EPOCH_ORDINAL)
    return Fallback(_date_binary_text(value))


_UNIX_EPOCH_DAYS = _EPOCH_ORDINAL - date(1970, 1, 1).toordinal()  # 2000-01-01 in Arrow's days
_UNIX_EPOCH_USECS = _UNIX_EPOCH_DAYS * _USECS_PER_DAY

DATE = Codec(
    "date",
    _date_from_text,
    _date_from_binary,
    _date_binary_text,
    vector_text=vec.date_text_kernel,
    vector_binary=vec.epoch_binary_kernel(
        ">i4", pa.date32(), _MIN_DAYS, _MAX_DAYS, _UNIX_EPOCH_DAYS
    ),
)

# --- timestamp and timestamptz ------------------------------------------------------


def _parse_iso_manual(value: str) -> datetime:
    """'YYYY-MM-DD HH:MM:SS[.f][±HH[:MM[:SS]]]' for Pythons whose fromisoformat is strict."""
    match = _ISO_TIMESTAMP.fullmatch(value)
    if match is None:
        raise ValueError("not an ISO timestamp")
    year, month, day, hour, minute, second, fraction, sign, oh, om, os_ = match.groups()
    tz = None
    if sign:
        offset = timedelta(hours=int(oh), minutes=int(om or 0), seconds=int(os_ or 0))
        tz = timezone(-offset if sign == "-" else offset)
    return datetime(
        int(year),
        int(month),
        int(day),
        int(hour),
        int(minute),
        int(second),
        int((fraction or "").ljust(6, "0")),
        tzinfo=tz,
    )


_ISO_TIMESTAMP = re.compile(
    r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?"
)
# 3.11's fromisoformat reads everything PostgreSQL prints (short fractions, '+00')
# and is several times faster; older Pythons need the regex.
_parse_iso = datetime.fromisoformat if sys.version_info >= (3, 11) else _parse_iso_manual


def _timestamp_binary_text(value: bytes, with_zone: bool) -> str:
    usecs = INT64.unpack(value)[0]
    if usecs == _INT64_MAX:
        return "infinity"
    if usecs == _INT64_MIN:
        return "-infinity"
    days, clock = divmod(usecs, _USECS_PER_DAY)
    text, bc = _date_text(days)
    # TimeZone is UTC in the peek session, so the offset is always +00.
    text = f"{text} {_clock_text(clock)}{'+00' if with_zone else ''}"
    return text + " BC" if bc else text


def _timestamp_from_text(value: str) -> object:
    if value[4:5] == "-" and value[-1] != "C":
        result = _parse_iso(value)
        if result.tzinfo is not None:
            raise ValueError("timestamp without time zone has an offset")
        return result
    if _TIMESTAMP_FALLBACK.fullmatch(value):
        return Fallback(value)
    raise ValueError("not an ISO timestamp")


def _timestamptz_from_text(value: str) -> object:
    if value[4:5] == "-" and value[-1] != "C":
        result = _parse_iso(value)
        if result.tzinfo is None:
            raise ValueError("timestamp with time zone lacks an offset")
        if result.tzinfo is not UTC:
            try:
                result = result.astimezone(UTC)
            except OverflowError:  # a local time in 9999 that is 10000 in UTC
                return Fallback(value)
        return result
    if _TIMESTAMPTZ_FALLBACK.fullmatch(value):
        return Fallback(value)
    raise ValueError("not an ISO timestamp with time zone")


def _timestamp_from_binary(value: bytes) -> object:
    usecs = INT64.unpack(value)[0]
    if _MIN_USECS <= usecs <= _MAX_USECS:
        # timedelta(0, seconds, micros) is about twice as fast as timedelta(microseconds=…)
        seconds, micros = divmod(usecs, _USECS_PER_SEC)
        return _EPOCH_NAIVE + timedelta(0, seconds, micros)
    return Fallback(_timestamp_binary_text(value, False))


def _timestamptz_from_binary(value: bytes) -> object:
    usecs = INT64.unpack(value)[0]
    if _MIN_USECS <= usecs <= _MAX_USECS:
        seconds, micros = divmod(usecs, _USECS_PER_SEC)
        return _EPOCH_UTC + timedelta(0, seconds, micros)
    return Fallback(_timestamp_binary_text(value, True))


TIMESTAMP = Codec(
    "timestamp_ntz",
    _timestamp_from_text,
    _timestamp_from_binary,
    lambda value: _timestamp_binary_text(value, False),
    vector_text=vec.timestamp_text_kernel(with_zone=False),
    vector_binary=vec.epoch_binary_kernel(
        ">i8", pa.timestamp("us"), _MIN_USECS, _MAX_USECS, _UNIX_EPOCH_USECS
    ),
)
TIMESTAMPTZ = Codec(
    "timestamp",
    _timestamptz_from_text,
    _timestamptz_from_binary,
    lambda value: _timestamp_binary_text(value, True),
    vector_text=vec.timestamp_text_kernel(with_zone=True),
    vector_binary=vec.epoch_binary_kernel(
        ">i8", pa.timestamp("us", tz="UTC"), _MIN_USECS, _MAX_USECS, _UNIX_EPOCH_USECS
    ),
)

# --- time, timetz, interval: Spark has no such types, so PostgreSQL's text ----------


def _time_binary_text(value: bytes) -> str:
    return _clock_text(INT64.unpack(value)[0])


def _timetz_binary_text(value: bytes) -> str:
    if len(value) != 12:
        raise ValueError("timetz is 12 bytes")
    return _clock_text(INT64.unpack_from(value)[0]) + _zone_text(INT32.unpack_from(value, 8)[0])


def _iso_part(number: int, unit: str) -> str:
    return f"{number}{unit}" if number else ""


def interval_text(usecs: int, days: int, months: int) -> str:
    """EncodeInterval with IntervalStyle=iso_8601 (PostgreSQL 15+ interval2itm)."""
    if months == _INT32_MAX and days == _INT32_MAX and usecs == _INT64_MAX:
        return "infinity"  # PostgreSQL 17's infinite intervals
    if months == _INT32_MIN and days == _INT32_MIN and usecs == _INT64_MIN:
        return "-infinity"
    if not (usecs or days or months):
        return "PT0S"
    years, months = _tdiv(months, 12), months - _tdiv(months, 12) * 12
    hours = _tdiv(usecs, _USECS_PER_HOUR)
    usecs -= hours * _USECS_PER_HOUR
    minutes = _tdiv(usecs, _USECS_PER_MINUTE)
    usecs -= minutes * _USECS_PER_MINUTE
    seconds = _tdiv(usecs, _USECS_PER_SEC)
    fraction = usecs - seconds * _USECS_PER_SEC
    parts = ["P", _iso_part(years, "Y"), _iso_part(months, "M"), _iso_part(days, "D")]
    if hours or minutes or seconds or fraction:
        parts += ["T", _iso_part(hours, "H"), _iso_part(minutes, "M")]
    if seconds or fraction:
        sign = "-" if seconds < 0 or fraction < 0 else ""
        parts.append(f"{sign}{abs(seconds)}{_seconds_fraction(abs(fraction))}S")
    return "".join(parts)


def _interval_binary_text(value: bytes) -> str:
    if len(value) != 16:
        raise ValueError("interval is 16 bytes")
    return interval_text(
        INT64.unpack_from(value)[0], INT32.unpack_from(value, 8)[0], INT32.unpack_from(value, 12)[0]
    )


TIME = string_codec(_time_binary_text)
TIMETZ = string_codec(_timetz_binary_text)
INTERVAL = string_codec(_interval_binary_text)
