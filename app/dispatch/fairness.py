"""Who goes first when due work exceeds the free workers: the plan of one
dispatch round, from what the dispatcher knows is due on its shards.

Order. Due rows fall into classes: the minute bucket they became due in,
then strict before flexible, then higher priority. A class goes out before
any row of a later class, across all the dispatcher's shards; within a
class, the shards holding the oldest rows are taken first.

Quotas, with lending. A team may hold `headroom` more running jobs (its
quota's share, less what it runs). Capacity is first shared among the
teams within their headroom, class by class; only what is left after that
(no team with due work wants more within its quota) is lent, class by class
again, to teams past their quota. Borrowed capacity comes back as the
borrower's jobs finish: a team past its quota gets nothing while others
with headroom wait.

Rotation. Within a class the capacity is shared by weight (deficit round
robin): each team is entitled to capacity x weight / sum of weights, the
fraction it could not get this round is credited to the next, and a team
whose demand is met keeps no credit. So shares follow weights over rounds
however small each round is, and a small team's jobs never wait behind
another team's whole batch.

Pure: no database, no clock; tests drive it directly.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

# A class of due rows: (bucket start, epoch s; strict; priority).
Class = tuple[float, bool, int]


def class_order(c: Class) -> tuple[float, bool, int]:
    """Earlier bucket first, then strict, then higher priority."""
    return (c[0], not c[1], -c[2])


@dataclass
class Edge:
    """What one shard has due: per (class, team), [rows due, oldest run time]."""
    cells: dict[tuple[Class, int], list[float]] = field(default_factory=dict)

    def due(self) -> int:
        return sum(int(v[0]) for v in self.cells.values())


@dataclass(frozen=True)
class Budget:
    weight: int
    headroom: int          # more running jobs the team may start within its quota (may be <= 0)


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


def plan(capacity: int, edges: dict[int, Edge], budgets: dict[int, Budget], credit: dict[int, float],
         teams: set[int] | None = None) -> list[Take]:
    """Up to `capacity` rows to claim, as (shard, class, team, n) takes,
    from the due edges of the shards; only teams in `teams` (None: any).
    Updates `credit` (the rotation's carried fractions)."""
    demand: dict[Class, dict[int, list[tuple[float, int, int]]]] = defaultdict(lambda: defaultdict(list))
    for shard, edge in edges.items():
        for (cls, team), (due, oldest) in edge.cells.items():
            if due > 0 and team in budgets and (teams is None or team in teams):
                demand[cls][team].append((oldest, shard, int(due)))
    waiting = {t for by_team in demand.values() for t in by_team}
    for t in [t for t in credit if t not in waiting]:
        del credit[t]                           # an idle team banks nothing
    classes = sorted(demand, key=class_order)
    given: dict[tuple[Class, int], int] = defaultdict(int)
    used: dict[int, int] = defaultdict(int)
    left = capacity
    for lending in (False, True):
        for cls in classes:
            if left <= 0:
                break
            caps = {}
            for team, cells in demand[cls].items():
                want = sum(n for _, _, n in cells) - given[cls, team]
                if not lending:
                    want = min(want, budgets[team].headroom - used[team])
                if want > 0:
                    caps[team] = want
            if not caps:
                continue
            got = share(left, caps, {t: budgets[t].weight for t in caps}, credit)
            for team, n in got.items():
                given[cls, team] += n
                used[team] += n
                left -= n
    takes = []
    for (cls, team), n in given.items():
        for _, shard, due in sorted(demand[cls][team]):    # oldest rows first
            if n <= 0:
                break
            k = min(n, due)
            takes.append(Take(shard, cls, team, k))
            n -= k
    return takes


def rotate(rows: list[dict], cls_of, team_of) -> list[dict]:
    """Claimed rows in the order they go out: class by class, and within a
    class one team's row after another's in turn."""
    by_class: dict[Class, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_class[cls_of(r)][team_of(r)].append(r)
    out = []
    for cls in sorted(by_class, key=class_order):
        queues = [q for _, q in sorted(by_class[cls].items())]
        depth = max(len(q) for q in queues)
        for i in range(depth):
            out.extend(q[i] for q in queues if i < len(q))
    return out
