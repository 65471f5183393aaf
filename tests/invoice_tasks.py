"""A module that declares tasks, as a user's would: imported by the
submitting child process of tests/test_tasks.py (which checks it pulls in
nothing of the worker) and by the worker in the test."""
from __future__ import annotations

import datetime as dt

import msgspec

from minutehand.client import task


class Invoice(msgspec.Struct):
    number: int
    due: dt.date
    lines: list[str] = []


send_invoice = task("send_invoice", Invoice)
