"""ByteScheduler's scheduler (executor/methods/bytescheduler.py) on a fake link whose chunks land
only when the test says: the send order is recorded and checked against the priority rule."""

from __future__ import annotations

import threading

import pytest

from meshplan.executor.methods.bytescheduler import Agreed, PriorityScheduler

TIMEOUT_S = 10


class Link:
    """issue() hands out works that land once release(n) has let the first n land."""

    def __init__(self):
        self.works: list[threading.Event] = []
        self.allowed = 0
        self.waiting = threading.Condition()
        self.waited_on: int | None = None
        self.negotiations: list[list[bool]] = []

    def issue(self, p, c):
        event = threading.Event()
        self.works.append(event)
        if len(self.works) <= self.allowed:
            event.set()
        link, index = self, len(self.works) - 1

        class Work:
            def wait(self):
                with link.waiting:
                    link.waited_on = index
                    link.waiting.notify_all()
                assert event.wait(TIMEOUT_S), "the test never released this chunk"

        return Work()

    def negotiate(self, flags):
        self.negotiations.append(flags)
        return Agreed(flags)

    def wait_blocked_on(self, index: int) -> None:
        with self.waiting:
            assert self.waiting.wait_for(lambda: self.waited_on == index, TIMEOUT_S)

    def release(self, n: int) -> None:
        self.allowed = n
        for event in self.works[:n]:
            event.set()


def _order(sched):
    return [(p, c) for p, c, *_ in sched.sent]


def test_a_later_ready_higher_priority_chunk_overtakes_the_queued_ones():
    """Priority 5 (near the output) is ready first with four chunks under a one-chunk credit; priority
    0 (the input side) becomes ready while the first chunk is in flight: it goes next, ahead of the
    three chunks of priority 5 still queued. Sent in plain ready order it would go last."""
    link = Link()
    sizes = [[100], [100], [100], [100], [100], [100] * 4]
    sched = PriorityScheduler(sizes, credit=100, issue=link.issue, negotiate=link.negotiate)
    sched.ready(5)
    link.wait_blocked_on(0)  # (5, 0) in flight, the window full, three chunks queued
    for p in (4, 3, 2, 1, 0):
        sched.ready(p)  # backward goes on: ready() never waits for the credit
    assert sched.ready_order == [5, 4, 3, 2, 1, 0]
    link.release(9)
    sched.finish()
    order = _order(sched)
    # (5,1) was committed by the round negotiated while (5,0) flew; the next round sees 4..0
    assert order[:2] == [(5, 0), (5, 1)]
    assert order[2:7] == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0)]
    assert order[7:] == [(5, 2), (5, 3)]
    assert sched.overtakes == 5
    assert all(in_flight <= 100 for *_, in_flight, _ in sched.sent)


def test_the_credit_bounds_the_bytes_in_flight_and_everything_is_sent_once():
    link = Link()
    sizes = [[60, 60, 30], [60], [60, 60]]
    sched = PriorityScheduler(sizes, credit=130, issue=link.issue, negotiate=link.negotiate)
    for p in (2, 1, 0):
        sched.ready(p)
    link.release(6)
    sched.finish()
    assert sorted(_order(sched)) == sorted((p, c) for p, s in enumerate(sizes) for c in range(len(s)))
    assert all(in_flight <= 130 for *_, in_flight, _ in sched.sent)


def test_a_failing_link_raises_in_the_training_thread():
    def issue(p, c):
        raise RuntimeError("link down")

    sched = PriorityScheduler([[10]], credit=10, issue=issue, negotiate=lambda f: Agreed(f))
    sched.ready(0)
    with pytest.raises(RuntimeError, match="communication thread failed: link down"):
        sched.finish()
