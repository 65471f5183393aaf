"""Who goes first when due work exceeds the free workers: the plan of one
dispatch round, from what the dispatcher knows is due on its shards.

Between teams, shares: each round's capacity is shared among the teams
with due work by weight, however old each team's rows are, so a team that
is behind (a flood due minutes ago) gets its share and no more while
another team has due work.

Within a team, order: its due rows fall into classes, the minute bucket
they became due in, then strict before flexible, then higher priority; a
class goes out before any row of a later class of the same team, across
all the dispatcher's shards (within one class, the shard whose oldest row
is oldest first; each shard gives its oldest rows first).

Quotas, with lending. A team may hold `headroom` more running jobs (its
quota's share, less what it runs; Fleet.headroom). Capacity is first shared among the
teams within their headroom; only what is left after that (no team with
due work wants more within its quota) is lent to teams past their quota,
and only while no other dispatcher reports a team waiting with headroom
(`waiting_elsewhere`: such a team's jobs sit on shards this dispatcher
cannot claim, and the workers it would lend to are the fleet's too).
Borrowed capacity comes back as the borrower's jobs finish: a team past
its quota gets nothing while others with headroom wait.

Rotation. The shares are by weight (deficit round robin): each team is
entitled to capacity x weight / sum of weights, the fraction it could not
get this round is credited to the next, and a team whose demand is met
keeps no credit. So shares follow weights over rounds however small each
round is, and a small team's jobs never wait behind another team's whole
batch, of this minute or of any earlier one.

Pure: no database, no clock; tests drive it directly.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from minutehand.store.claim import MemberSays

# A class of due rows: (bucket start, epoch s; strict; priority).
Class = tuple[float, bool, int]
# A shard's known job names past this many are unknown (added to between reads).
NAMES_PER_SHARD = 64


def class_order(c: Class) -> tuple[float, bool, int]:
    """Within a team: earlier bucket first, then strict, then higher priority."""
    return (c[0], not c[1], -c[2])


class DueIndex:
    """What the dispatcher's shards have due, by (class, team) and shard:
    [rows due, oldest run time], with each (class, team)'s total, kept as
    edges are read and counted down, so that planning a round costs in
    proportion to the classes and teams waiting and the shards it takes
    from, not to every cell of every shard.

    A read may count a cell only up to a cap (its oldest rows): such a cell
    is `capped`, and take() says when it has been claimed down, so that
    the shard is read again.

    Per shard, the job names its due rows may have (`names`; None:
    unknown): never fewer than its rows have, perhaps more (rows claimed or
    cancelled since), so a worker of other names need not look there."""

    def __init__(self) -> None:
        self.cells: dict[tuple[Class, int], dict[int, list[float]]] = {}
        self.totals: dict[tuple[Class, int], int] = {}
        self.of_shard: dict[int, set[tuple[Class, int]]] = {}
        self.capped: set[tuple[int, tuple[Class, int]]] = set()    # (shard, cell): more due than counted
        self.names: dict[int, set[str] | None] = {}

    def set_shard(self, shard: int, cells: dict[tuple[Class, int], list[float]], cap: int | None = None,
                  names: set[str] | None = None) -> None:
        """A shard's edge as just read (each cell counted up to cap rows), and
        the names of its rows (None: unknown)."""
        self.remove_shard(shard)
        self.names[shard] = names
        for key, (due, oldest) in cells.items():
            if due > 0:
                self.cells.setdefault(key, {})[shard] = [due, oldest]
                self.totals[key] = self.totals.get(key, 0) + int(due)
                if cap is not None and due >= cap:
                    self.capped.add((shard, key))
        if cells:
            self.of_shard[shard] = {k for k, (due, _) in cells.items() if due > 0}

    def add_to_shard(self, shard: int, cells: dict[tuple[Class, int], list[float]], cap: int | None = None,
                     names: set[str] | None = None) -> None:
        """Rows that came due on a shard since its edge was read, and their
        names (None: unknown)."""
        known = self.names.get(shard, set()) if shard in self.of_shard else set()
        if known is not None and names is not None and len(known | names) <= NAMES_PER_SHARD:
            self.names[shard] = known | names
        else:
            self.names[shard] = None
        for key, (due, oldest) in cells.items():
            if due <= 0:
                continue
            if cap is not None and due >= cap:
                self.capped.add((shard, key))
            on = self.cells.setdefault(key, {})
            if shard in on:
                on[shard][0] += due
                on[shard][1] = min(on[shard][1], oldest)
            else:
                on[shard] = [due, oldest]
            self.totals[key] = self.totals.get(key, 0) + int(due)
            self.of_shard.setdefault(shard, set()).add(key)

    def remove_shard(self, shard: int) -> None:
        self.names.pop(shard, None)
        for key in self.of_shard.pop(shard, ()):
            self._drop(shard, key)

    def may_hold(self, shard: int, names: tuple[str, ...]) -> bool:
        """Whether a due row of the shard may have one of these job names."""
        known = self.names.get(shard)
        return known is None or not known.isdisjoint(names)

    def holders(self, shards: list[int]) -> tuple[dict[str, list[int]], list[int]]:
        """Of these shards, those whose due rows may have each job name, and
        those whose names are unknown."""
        by_name: dict[str, list[int]] = defaultdict(list)
        unknown = []
        for s in shards:
            known = self.names.get(s)
            if known is None:
                unknown.append(s)
            else:
                for n in known:
                    by_name[n].append(s)
        return by_name, unknown

    def take(self, shard: int, key: tuple[Class, int], n: int, gone: bool = False) -> bool:
        """n rows of the cell were claimed (gone: none is left there).
        Whether the shard should be read again: a capped cell ran out."""
        cell = self.cells.get(key, {}).get(shard)
        if cell is None:
            return False
        if gone or cell[0] <= n:
            more = (shard, key) in self.capped
            self._drop(shard, key)
            self.of_shard.get(shard, set()).discard(key)
            return more
        cell[0] -= n
        self.totals[key] -= n
        return False

    def _drop(self, shard: int, key: tuple[Class, int]) -> None:
        self.capped.discard((shard, key))
        shards = self.cells.get(key)
        if shards is None or shard not in shards:
            return
        self.totals[key] -= int(shards.pop(shard)[0])
        if not shards:
            del self.cells[key], self.totals[key]

    def due_shards(self) -> list[int]:
        return [s for s, keys in self.of_shard.items() if keys]

    def teams(self) -> set[int]:
        return {team for _, team in self.cells}


@dataclass(frozen=True)
class Budget:
    weight: int
    headroom: int          # more running jobs the team may start within its quota (may be <= 0)

    def less(self, n: int) -> Budget:
        """After n more of the team's jobs are asked for."""
        return Budget(self.weight, self.headroom - n)


class Fleet:
    """The other dispatchers, as their last membership renewals said: what a
    team's share of its quota here depends on.

    A team's quota, less its jobs running from the dispatchers where it has
    no due rows (they hold that much until those end), is divided between
    this dispatcher and the others where it has due rows (or that have not
    read theirs yet), by their shards, rounded up. So its share follows its
    due work: with its last jobs on one dispatcher's shards it may run its
    whole quota there. And never more than the quota less what the others
    said they run (one may not know yet that the team's due work appeared
    here). Every dispatcher computing the same shares, N of them run at
    most quota + N - 1 of a team's jobs (the rounding)."""

    def __init__(self, peers: Sequence[tuple[int, MemberSays]] = ()):
        """peers: each other dispatcher's shards (by the assignment) and what it said."""
        self.waiting = frozenset(t for _, says in peers for t in says.waiting)
        self._unread = sum(n for n, says in peers if says.due is None)
        # team -> (shards of the others with its due rows, its jobs running from the
        # others without, its jobs running from all the others)
        self._teams: dict[int, tuple[int, int, int]] = {}
        for team in {t for _, says in peers for t in (says.due or ())} | {t for _, says in peers for t in says.running}:
            due = held = running = 0
            for n, says in peers:
                runs = says.running.get(team, 0)
                running += runs
                if says.due is None or team in says.due:
                    due += n
                else:
                    held += runs
            self._teams[team] = (due, held, running)

    def headroom(self, quota: int, team: int, shards: int, running: int) -> int:
        """How many more of the team's jobs this dispatcher may start, with
        `shards` of its own and `running` of the team's jobs from them."""
        due, held, elsewhere = self._teams.get(team, (self._unread, 0, 0))
        share = math.ceil(max(0, quota - held) * shards / (shards + due)) if shards else 0
        return min(share, quota - elsewhere) - running


@dataclass(frozen=True)
class Take:
    shard: int
    cls: Class
    team: int
    n: int


def share(n: int, caps: dict[int, int], weights: dict[int, int], credit: dict[int, float]) -> dict[int, int]:
    """n slots among teams wanting up to caps[t], by weight, carrying each
    team's unmet fraction in credit (deficit round robin)."""
    alloc = dict.fromkeys(caps, 0)
    active = {t for t, c in caps.items() if c > 0}
    while n > 0 and active:
        total = sum(weights[t] for t in active)
        entitled = {t: credit.get(t, 0.0) + n * weights[t] / total for t in active}
        give, room = {}, n
        for t in sorted(active, key=lambda t: (-entitled[t], t)):     # carried credit can ask for more than n
            give[t] = max(0, min(caps[t] - alloc[t], math.floor(entitled[t]), room))
            room -= give[t]
        if room == n:                          # fewer slots than whole shares: the largest entitlements
            for t in sorted(active, key=lambda t: (-entitled[t], t))[:n]:
                give[t] = 1
        for t in active:
            alloc[t] += give[t]
            credit[t] = entitled[t] - give[t]
            n -= give[t]
        met = {t for t in active if alloc[t] >= caps[t]}
        for t in met:
            credit[t] = 0.0
        active -= met
    return alloc


def plan(capacity: int, due: DueIndex, budgets: dict[int, Budget], credit: dict[int, float],
         teams: set[int] | None = None, shards: set[int] | None = None,
         taken: dict[tuple[int, tuple[Class, int]], int] | None = None,
         waiting_elsewhere: frozenset[int] = frozenset(), short: set[int] | None = None) -> list[Take]:
    """Up to `capacity` rows to claim, as (shard, class, team, n) takes, from
    what is due; only teams in `teams` and shards in `shards` (None: any),
    less what `taken` already holds per (shard, (class, team)) (and adds to
    it). No lending to a team while another is in `waiting_elsewhere`.
    Updates `credit` (the rotation's carried fractions) and adds to `short`
    the teams the capacity ran out for before their headroom did."""
    taken = {} if taken is None else taken
    taken_of: dict[tuple[Class, int], int] = defaultdict(int)
    for (_, key), n in taken.items():
        taken_of[key] += n
    waiting = {t for _, t in due.cells}
    for t in [t for t in credit if t not in waiting]:
        del credit[t]                           # an idle team banks nothing
    by_team: dict[int, list[tuple[Class, int]]] = defaultdict(list)
    for key in sorted((k for k in due.cells if k[1] in budgets and (teams is None or k[1] in teams)),
                      key=lambda k: class_order(k[0])):
        by_team[key[1]].append(key)
    left_in = {key: _available(due, key, shards, taken, taken_of) for keys in by_team.values() for key in keys}
    given: dict[tuple[Class, int], int] = defaultdict(int)
    used: dict[int, int] = defaultdict(int)
    left = capacity
    for lending in (False, True):
        caps = {}
        for team, keys in by_team.items():
            want = sum(left_in[k] - given[k] for k in keys)
            if not lending:
                want = min(want, budgets[team].headroom - used[team])
            elif waiting_elsewhere - {team}:
                continue
            if want > 0:
                caps[team] = want
        if left > 0 and caps:
            for team, n in share(left, caps, {t: budgets[t].weight for t in caps}, credit).items():
                used[team] += n
                left -= n
                for key in by_team[team]:       # the team's own rows in its order
                    k = min(n, left_in[key] - given[key])
                    given[key] += k
                    n -= k
        if not lending and short is not None:
            short.update(t for t, want in caps.items() if used[t] < want)
    takes = []
    for key, n in given.items():
        # The shards holding the oldest rows first: else a shard read again
        # (which moves it to the end of the cell's dict) would wait behind
        # the others whenever a round takes less than is due, until its rows
        # fell into an older class when the minute turned.
        for shard, (count, _) in sorted(due.cells[key].items(), key=lambda c: c[1][1]):
            if n <= 0:
                break
            if shards is not None and shard not in shards:
                continue
            k = min(n, int(count) - taken.get((shard, key), 0))
            if k > 0:
                takes.append(Take(shard, key[0], key[1], k))
                taken[shard, key] = taken.get((shard, key), 0) + k
                n -= k
    return takes


def _available(due: DueIndex, key: tuple[Class, int], shards: set[int] | None,
               taken: dict[tuple[int, tuple[Class, int]], int], taken_of: dict[tuple[Class, int], int]) -> int:
    """Rows of a (class, team) the plan may still take (a sum over shards
    only when some are excluded)."""
    if shards is None:
        return due.totals[key] - taken_of[key]
    return sum(int(count) - taken.get((shard, key), 0) for shard, (count, _) in due.cells[key].items()
               if shards is None or shard in shards)


def rotate(rows: list, cls_of, team_of) -> list:
    """Claimed rows in the order they go out: one team's row after
    another's in turn, each team's in its class order."""
    by_team: dict[int, list] = defaultdict(list)
    for r in rows:
        by_team[team_of(r)].append(r)
    queues = [sorted(q, key=lambda r: class_order(cls_of(r))) for _, q in sorted(by_team.items())]
    out = []
    for i in range(max((len(q) for q in queues), default=0)):
        out.extend(q[i] for q in queues if i < len(q))
    return out
