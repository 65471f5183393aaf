"""Refusals from the procedures, by SQLSTATE (sql/functions/submit.sql lists them).

Each carries the HTTP status it maps to, so the API layer needs no table of
its own, and the procedure's message, written for a person to act on."""
import psycopg


class StoreError(Exception):
    status = 500

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidInput(StoreError):
    status = 400


class StaleLease(StoreError):
    status = 403


class NotFound(StoreError):
    status = 404


class Conflict(StoreError):
    status = 409


class PayloadTooLarge(StoreError):
    status = 413


class RateLimited(StoreError):
    """Over the team's submission rate: nothing was written; enough tokens
    for the refused jobs are there after retry_after_s."""
    status = 429

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PendingCeiling(StoreError):
    """The jobs would take the team past its ceiling of jobs submitted and
    not finished: nothing was written."""
    status = 429

    def __init__(self, message: str, pending: int, ceiling: int):
        super().__init__(message)
        self.pending = pending
        self.ceiling = ceiling


class Contention(StoreError):
    """The database aborted the transaction (deadlock, serialization failure)
    every time it was tried: nothing was written, and trying again later is
    safe. Not the database being away."""
    status = 503


class OutcomesPartlyWritten(Exception):
    """An outcome batch sent as several calls (one per Citus shard) of which
    some failed: `outcomes` holds the answers of the calls that committed,
    in input order, and None for every item of a call that failed (nothing
    of which was written); `cause` is the first failure."""

    def __init__(self, outcomes: list, cause: Exception):
        super().__init__(f"some outcome calls failed: {cause}")
        self.outcomes = outcomes
        self.cause = cause


BY_SQLSTATE = {"MH400": InvalidInput, "MH403": StaleLease, "MH404": NotFound,
               "MH409": Conflict, "MH413": PayloadTooLarge}


def node_away(exc: BaseException | None) -> bool:
    """Whether a statement failed because a Citus worker node it needed
    could not be reached (class 08, as Citus reports a node it cannot
    connect to): it fails at once, again, until the node is back."""
    return (getattr(exc, "sqlstate", None) or "").startswith("08")


def unreachable(exc: BaseException | None) -> bool:
    """Whether a statement failed for a part of the cluster, not for itself:
    a node away (node_away), or a lock it needed stayed held past its
    lock_timeout (55P03: take_shard_leases gives up after a second, as on
    Citus a shard group being moved blocks writes). Nothing of it was written;
    the same statement later, or the other nodes' now, may well succeed."""
    return node_away(exc) or getattr(exc, "sqlstate", None) == "55P03"


def translate(exc: psycopg.Error) -> Exception:
    """The StoreError for a refusal raised by a procedure; other errors as they are."""
    kind = BY_SQLSTATE.get(exc.sqlstate or "")
    if kind is None:
        return exc
    return kind(exc.diag.message_primary or str(exc))
