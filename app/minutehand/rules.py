"""The rules the HTTP API, the admin UI and the CLI all apply, kept in one
place so that each says the same: what a team name looks like, the range
of a team's retention, what a webhook's URL and secret must be, the cursor
of a team's events feed, what a series' repeat spec may be, and the next
fire times a series shows.

A check answers a plain value: the reason a person can act on, or None when
there is nothing to refuse. Each caller turns a reason into its own refusal
(the API a problem+json response, the admin UI its form error, the CLI its
message). Nothing here knows HTTP (tests/test_layering.py checks it).
"""
from __future__ import annotations

import base64
import binascii
import functools
import re
import urllib.parse
import zoneinfo

from minutehand.protocol.api import SECRET_LENGTHS, SECRET_PATTERN, TEAM_NAME_PATTERN
from minutehand.settings import RETENTION_MAX_S, RETENTION_MIN_S
from minutehand.store import repeat as repeats
from minutehand.store.records import Repeat
from minutehand.store.series import SeriesDetail

# ---------------------------------------------------------------- teams


def retention_problem(retention_s: int | None) -> str | None:
    """Why a team's retention_s is refused (None: fine). None sets the server's."""
    if retention_s is None:
        return None
    if not RETENTION_MIN_S <= int(retention_s) <= RETENTION_MAX_S:
        return (f"retention_s: {int(retention_s)} is out of range: give seconds from {RETENTION_MIN_S} to "
                f"{RETENTION_MAX_S} (10 years), or null for the server's job_retention_s")
    return None


# ---------------------------------------------------------------- webhooks


def url_problem(url: str) -> str | None:
    """Why a webhook URL cannot be used (None: it can)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        return f"url is not a URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "url must be an absolute http:// or https:// URL with a host"
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7f for c in url):
        return "url must not hold whitespace or control characters"
    return None


def secret_problem(secret: str) -> str | None:
    if not re.fullmatch(SECRET_PATTERN, secret):
        low, high = SECRET_LENGTHS
        return f"secret must be {low} to {high} printable ASCII characters, without spaces"
    return None


# ---------------------------------------------------------------- the events feed's cursor
# Opaque to clients: it encodes the position (transaction id, event id) the next page starts after.
_EVENTS_POSITION = re.compile(r"^([0-9]{1,20})\.([0-9]{1,19})$")
# Where a feed read with no cursor starts: before every event kept.
EVENTS_START = ("0", 0)
NOT_AN_EVENTS_CURSOR = "after is not a cursor this API returned (pass next_cursor as it came)"


def encode_events_cursor(xid: str, event_id: int) -> str:
    return base64.urlsafe_b64encode(f"{xid}.{event_id}".encode()).decode().rstrip("=")


def decode_events_cursor(cursor: str) -> tuple[str, int] | None:
    """The position a cursor encode_events_cursor made encodes; None for any
    other text (refuse it with NOT_AN_EVENTS_CURSOR)."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        text = ""
    m = _EVENTS_POSITION.fullmatch(text)
    if m is None or int(m.group(1)) >= 2**64 or int(m.group(2)) >= 2**63:
        return None
    return m.group(1), int(m.group(2))


# ---------------------------------------------------------------- series
NEXT_FIRE_TIMES = 5
# Zone files a host may have that are no IANA zone name: its own local time
# (another zone on each host), tzdata's "Factory" placeholder and the POSIX
# rules file. The posix/ and right/ copies (right/ counts leap seconds) are
# not listed by available_timezones() in the first place.
_HOST_ZONES = frozenset({"localtime", "Factory", "posixrules"})


@functools.cache
def series_zones() -> frozenset[str]:
    """The zone names a series may be given: the IANA names of the tz
    database, which mean one zone wherever they are found (read once: it
    walks the zone files)."""
    return frozenset(z for z in zoneinfo.available_timezones()
                     if z not in _HOST_ZONES and not z.startswith(("posix/", "right/")))


def repeat_problem(repeat: Repeat | None) -> str | None:
    """Why a repeat spec is refused (None: it is fine, or absent): a cron
    expression must be its 5 fields apart by single spaces (it is stored,
    shown and compared as sent, while APScheduler reads past any
    whitespace), a zone an IANA name; then repeats.problem (APScheduler)."""
    if repeat is None:
        return None
    if repeat.cron is not None and repeat.cron != " ".join(repeat.cron.split()):
        return (f"repeat.cron {repeat.cron!r} has whitespace around it or between its fields other than one "
                "space: send the 5 fields apart by single spaces, like '0 3 * * *'")
    if repeat.timezone is not None and repeat.timezone not in series_zones():
        return (f"repeat.timezone {repeat.timezone[:100]!r} is not an IANA time zone name (like Europe/Berlin; "
                "not localtime, Factory or a posix/ or right/ copy, which differ from host to host)")
    return repeats.problem(repeat)


def next_fire_times(s: SeriesDetail) -> list:
    """The next fire times after the database's now (none for a cancelled series)."""
    if s.state == "cancelled":
        return []
    return repeats.fire_times(s.repeat, s.now, NEXT_FIRE_TIMES, s.now, anchor=s.first_due_at)
