"""Worker affinity in the process pool (rlvr.workers.ProcessPool.run ``slots``): a job pinned to a slot runs in
that slot's worker process (checked by its pid), waits for it while other workers are idle, follows the slot to its
replacement after the worker died; free jobs keep going to any worker; bad slots are refused."""

from __future__ import annotations

import os
import time

import pytest

from rlvr.workers import ProcessPool


def _init():
    def handle(job):
        what, arg = job
        if what == "die":
            os._exit(3)
        if what == "sleep":
            time.sleep(arg)
        if what == "stamp":  # when it started (CLOCK_MONOTONIC: one clock for all processes)
            return os.getpid(), time.monotonic()
        return os.getpid(), arg

    return handle


@pytest.fixture(scope="module")
def pool():
    p = ProcessPool(_init, (), num_workers=3, timeout_s=5.0, name="affinity")
    yield p
    p.close()


def pids(p: ProcessPool) -> list[int]:
    return [w.proc.pid for w in p._workers]


def test_pinned_jobs_run_in_their_slots_worker_and_free_jobs_anywhere(pool):
    slots = [2, 0, None, 2, 1, None, 0, 2]
    out = pool.run([("echo", i) for i in range(8)], slots)
    assert [o.value[1] for o in out] == list(range(8))  # in input order
    by_slot = pids(pool)
    for o, k in zip(out, slots):
        assert o.ok and o.slot in (0, 1, 2)
        assert o.value[0] == by_slot[o.slot]  # the slot it reports is the process that ran it
        if k is not None:
            assert o.slot == k
    assert pool.run([("echo", 0)], None)[0].slot in (0, 1, 2)


def test_a_pinned_job_waits_for_its_slot_while_other_workers_are_idle(pool):
    t0 = time.monotonic()
    out = pool.run([("sleep", 0.3)] * 3, [1, 1, 1])
    took = time.monotonic() - t0
    assert [o.slot for o in out] == [1, 1, 1] and len({o.value[0] for o in out}) == 1
    assert took >= 0.9, took  # one after another on slot 1, not spread over the three workers
    # a slot's worker takes its pinned jobs before free ones: the pinned job does not wait behind a free queue
    t0 = time.monotonic()
    out = pool.run([("sleep", 0.3)] * 6 + [("stamp", None)], [None] * 6 + [0])
    assert out[6].slot == 0 and out[6].value[1] - t0 < 0.2, out[6].value[1] - t0  # free first: >= 0.3 s


def test_the_slot_follows_its_worker_to_the_replacement(pool):
    old = pids(pool)
    out = pool.run([("die", 0), ("echo", 1)], [2, 0])
    assert out[0].reason == "crashed" and out[0].slot == 2 and out[1].value == (old[0], 1)
    new = pids(pool)
    assert new[2] != old[2] and new[:2] == old[:2]
    out = pool.run([("echo", "after")], [2])
    assert out[0].slot == 2 and out[0].value == (new[2], "after")
    # a worker that died while idle: the pinned job goes to the replacement, not lost
    p = pool._workers[1].proc
    p.kill()
    p.join(5)
    out = pool.run([("echo", "x")], [1])
    assert out[0].ok and out[0].slot == 1 and out[0].value[0] == pids(pool)[1] != p.pid


@pytest.mark.parametrize("slots, why", [([0, 3], r"slot 3 is not a worker of this pool \(slots 0..2\)"),
                                        ([-1, 0], r"slot -1 is not a worker"), ([0], r"1 slots for 2 jobs"),
                                        (["0", 0], r"slot '0' is not a worker")])
def test_bad_slots_are_refused_with_the_fix(pool, slots, why):
    with pytest.raises(ValueError, match=why):
        pool.run([("echo", 0), ("echo", 1)], slots)
