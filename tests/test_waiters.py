"""The dispatcher's queue of long-polls (minutehand.dispatch.waiters): taken
in queue order across filters, looked up by the job names due, gone ones
swept out once they are half of it."""
from __future__ import annotations

import asyncio

from minutehand.dispatch.waiters import Waiter, Waiters


def waiter(worker: str, names: tuple[str, ...] | None = None, teams: tuple[str, ...] | None = None) -> Waiter:
    loop = asyncio.new_event_loop()
    try:
        return Waiter(worker, 1, (names, teams), loop.create_future(), loop)
    finally:
        loop.close()


def test_waiters_are_taken_in_queue_order_across_filters_and_leave_the_queue():
    q = Waiters()
    a1, b1, a2, b2, a3 = waiter("a1", ("a",)), waiter("b1", ("b",)), waiter("a2", ("a",)), waiter("b2", ("b",)), \
        waiter("a3", ("a",))
    for w in (a1, b1, a2, b2, a3):
        q.append(w)
    assert [w.worker for w in q.take([(("a",), None), (("b",), None)], 3)] == ["a1", "b1", "a2"]
    assert (a1.state, b1.state, a2.state, b2.state) == ("taken", "taken", "taken", "waiting")
    assert q.waiting() == 2
    assert [w.worker for w in q.take([(("a",), None), (("b",), None)], 10)] == ["b2", "a3"]
    assert q.waiting() == 0 and q.take([(("a",), None)], 10) == []


def test_one_filter_passed_over_keeps_its_place():
    q = Waiters()
    b1, a1, a2 = waiter("b1", ("b",)), waiter("a1", ("a",)), waiter("a2", ("a",))
    for w in (b1, a1, a2):
        q.append(w)
    # Both of a's are looked at; only a1 is older than b1's next.
    assert [w.worker for w in q.take([(("a",), None), (("b",), None)], 2)] == ["b1", "a1"]
    assert [w.worker for w in q.take([(("a",), None)], 5)] == ["a2"]


def test_a_waiter_put_back_in_front_goes_first():
    q = Waiters()
    first, second = waiter("first"), waiter("second")
    q.append(first)
    q.append(second)
    [taken] = q.take([(None, None)], 1)
    assert taken is first
    taken.state = "waiting"                              # its round failed: it waits again, in front
    q.appendleft(taken)
    assert [w.worker for w in q.take([(None, None)], 2)] == ["first", "second"]


def test_candidates_are_the_filters_of_the_names_due_and_of_any_name():
    q = Waiters()
    for w in (waiter("x", ("a", "b")), waiter("y", ("c",)), waiter("z"), waiter("t", None, ("team",))):
        q.append(w)
    assert q.candidates(["b"], unknown=False) == {(("a", "b"), None), (None, None), (None, ("team",))}
    assert q.candidates(["zzz"], unknown=False) == {(None, None), (None, ("team",))}
    assert len(q.candidates([], unknown=True)) == 4      # rows whose names are unknown: every filter


def test_gone_waiters_are_skipped_and_swept_once_half_the_queue():
    q = Waiters()
    ws = [waiter(f"w{i}", (f"n{i % 2}",)) for i in range(6)]
    for w in ws:
        q.append(w)
    q.leave(ws[0])
    q.leave(ws[2])
    assert q.waiting() == 4 and q._kept == 6             # kept until they are half
    assert [w.worker for w in q.take([(("n0",), None)], 5)] == ["w4"]
    q.leave(ws[1])
    q.leave(ws[3])                                       # 2 of 3 kept are gone: swept
    assert q._kept == 1 and q.waiting() == 1
    assert q.candidates(["n0"], unknown=False) == set()  # a filter with none waiting is forgotten
    assert [w.worker for w in q.take([(("n1",), None)], 5)] == ["w5"]


def test_a_workers_waiting_polls_and_clearing():
    q = Waiters()
    mine, other, mine_too = waiter("me", ("a",)), waiter("other", ("a",)), waiter("me", ("b",))
    for w in (mine, other, mine_too):
        q.append(w)
    assert set(q.of_worker("me")) == {mine, mine_too}
    q.leave(mine)
    assert q.of_worker("me") == [mine_too]
    assert set(q.clear()) == {other, mine_too}
    assert q.waiting() == 0 and q.candidates([], unknown=True) == set()
