"""JSON values taken as text: a job's payload and a job's result are kept as
the JSON text that was sent (never decoded on the server) and stored as
jsonb. What such text may be, checked in one place for the HTTP API, the
worker protocol and the worker library (which fails a job whose result
would be refused, rather than have its report refused).
"""
from __future__ import annotations

import math
import re

# A payload or a result: any JSON, kept as the request's text and stored as
# jsonb. At most MAX_JSON_BYTES of JSON text (the payload's size is checked in
# SQL, mh_payload_max_bytes; a result's here, as sent), nested at most
# MAX_JSON_DEPTH levels: deeper values cost the server a stack frame per level
# to read, and the worker must be able to decode whatever was accepted.
MAX_JSON_BYTES = 256 * 1024
MAX_JSON_DEPTH = 64

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# Brackets only, { as [ and } as ]: a string of [ and ] whose nesting is the value's.
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
# The escape \u0000 (an odd number of backslashes before u0000: an even one is
# text), which jsonb cannot hold.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
# A number that may be beyond a double (about 1.8e308, the most JSON readers
# hold: msgspec refuses 1e400, JavaScript reads Infinity, while jsonb keeps
# it and hands it back as 401 digits): one with an exponent, or with 309
# digits before any fraction. Only those are read, to see if they are finite;
# each search starts only where a run of digits does (linear in the text).
_BIG_HINT = re.compile(rb"[0-9][eE]|(?<![0-9])[0-9]{309}")
_BIG_NUMBER = re.compile(rb"(?<![0-9.])[0-9]+(?:\.[0-9]+)?[eE][+-]?[0-9]+|(?<![0-9.])[0-9]{309,}")


def nested_deeper(text: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether valid JSON text nests arrays and objects more than `limit`
    deep. Cheap for most values: text with at most `limit` brackets cannot
    (one count, in C). Otherwise strings are dropped and the brackets kept;
    each pass of removing every innermost pair lowers the depth by exactly
    one, so text left after `limit` passes is deeper (every step in C; at
    most `limit` passes over the brackets)."""
    if text.count(b"[") + text.count(b"{") <= limit:
        return False
    if b'"' in text:
        text = _STRING.sub(b"", text)
    text = text.translate(_BRACKETS, _NOT_BRACKETS)
    if b"[" * (limit + 1) in text:
        return True
    for _ in range(limit):
        text = text.replace(b"[]", b"")
        if not text:
            return False
    return bool(text)


def may_overflow(text: bytes) -> bool:
    """Whether JSON text may hold a number beyond a double: one search, in C.
    (False for nearly every value; True calls for json_text_problem.)"""
    return _BIG_HINT.search(text) is not None


def beyond_double(text: bytes) -> bytes | None:
    """The first number of valid JSON text that is not finite as a double
    (1e400, -1e999, 400 digits), outside its strings; None if there is none."""
    if not may_overflow(text):
        return None
    if b'"' in text:
        text = _STRING.sub(b'""', text)
    for number in _BIG_NUMBER.findall(text):
        if not math.isfinite(float(number)):
            return number
    return None


def json_text_problem(what: str, text: bytes) -> str | None:
    """Why valid JSON text cannot be accepted as a payload or result; None
    if it can. (Its size is checked where it is stored.)"""
    if text.count(b"[") + text.count(b"{") > MAX_JSON_DEPTH and nested_deeper(text):
        return f"{what} is nested more than {MAX_JSON_DEPTH} levels deep (arrays and objects): flatten it"
    if b"\\u0000" in text and _NUL_ESCAPE.search(text):
        return (f"{what} cannot be stored: it contains the escape \\u0000 (a NUL character), which "
                "PostgreSQL's jsonb cannot hold")
    if (number := beyond_double(text)) is not None:
        shown = number[:20].decode() + ("..." if len(number) > 20 else "")
        return (f"{what} holds the number {shown}, beyond what JSON readers can hold (a double: up to about "
                "1.8e308): send it as a string")
    if not text.isascii():
        try:
            text.decode()
        except UnicodeDecodeError as exc:
            return f"{what} cannot be stored: it is not UTF-8 (byte {exc.start})"
    return None
