"""The admin UI's jobs pages (see app/admin/app.py for the contract)."""
from __future__ import annotations

HANDLERS: list = []
