"""The continuous-batching fake of ``benchmarks/async_speedup.py`` part 1c (``loop_fakes.SlotSim``, ``SlotEngine``):
its schedule driven tick by tick with every value worked out by hand (steps to finish, busy slot-steps, idle and
zero-slot ticks, the version of each token around an update), then the threaded engine's calls (an update landing
mid-request in flight, after the request in lock-step) and its shares over two marks."""

from __future__ import annotations

import threading
import time

import pytest
from loop_fakes import CallLog, SlotEngine, SlotSim

from rlvr.types import Prompt, SamplingConfig


def run(sim: SlotSim, ticks: int) -> list[tuple[int, list, list]]:
    """Tick ``ticks`` times; per tick (its number, the batches finished and the updates landed in it)."""
    out = []
    for _ in range(ticks):
        finished, landed = sim.tick()
        out.append((sim.ticks, finished, landed))
    return out


def test_lock_step_runs_a_batch_alone_continuous_batching_fills_the_free_slot():
    """2 slots, batch A of lengths 3 and 1, batch B of length 2, both waiting before tick 1.
    Lock-step: A0 ticks 1-3, A1 tick 1, B0 waits for A's end although a slot is free from tick 2: ticks 4-5.
    5 steps, 6 busy slot-steps, idle 1 - 6 / (2 x 5) = 0.4.
    Continuous: B0 takes A1's slot at tick 2 and ends with A0 at tick 3: 3 steps, 6 busy slot-steps, idle 0."""
    lock = SlotSim(2, in_flight=False)
    a, b = lock.add([3, 1]), lock.add([2])
    run(lock, 6)
    assert [s.steps for s in a.samples + b.samples] == [[1, 2, 3], [1], [4, 5]]
    assert (a.done_tick, b.done_tick) == (3, 5)
    assert (lock.steps, lock.busy, lock.zero_ticks) == (5, 6, 1)  # tick 6: nothing left
    assert 1 - lock.busy / (2 * 5) == pytest.approx(0.4)

    cont = SlotSim(2, in_flight=True)
    a, b = cont.add([3, 1]), cont.add([2])
    run(cont, 3)
    assert [s.steps for s in a.samples + b.samples] == [[1, 2, 3], [1], [2, 3]]
    assert (a.done_tick, b.done_tick) == (3, 3)
    assert (cont.steps, cont.busy, cont.zero_ticks) == (3, 6, 0)
    assert cont.idle


def test_slots_bound_one_batch_in_both_modes():
    """1 slot, one batch of lengths 2, 1, 3: the samples take the slot in turn (ticks 1-2, 3, 4-6) in both modes."""
    for in_flight in (False, True):
        sim = SlotSim(1, in_flight=in_flight)
        b = sim.add([2, 1, 3])
        out = run(sim, 6)
        assert [s.steps for s in b.samples] == [[1, 2], [3], [4, 5, 6]]
        assert [t for t, fin, _ in out if fin] == [6]
        assert b.done_tick == 6 and sim.busy == 6


def test_an_update_lands_between_two_steps_in_flight_and_after_the_batch_in_lock_step():
    """Batch A of one 4-token sample; two ticks; the update to v1 arrives, then batch B (one 2-token sample).
    In flight (2 slots): v1 lands before step 3: A's tokens [0, 0, 1, 1]; B enters at tick 3 under v1: steps 3-4.
    Lock-step: the update waits for A (all v0), lands at tick 5 before the step (0 load ticks): B [1, 1], steps 5-6.
    ``updates``: (version, decode steps taken when it landed)."""
    cases = ((True, [0, 0, 1, 1], [3, 4], (1, 2)), (False, [0, 0, 0, 0], [5, 6], (1, 4)))
    for in_flight, a_v, b_steps, landed in cases:
        sim = SlotSim(2, in_flight=in_flight)
        a = sim.add([4])
        run(sim, 2)
        u = sim.post(1)
        b = sim.add([2])
        run(sim, 4)
        assert a.samples[0].versions == a_v
        assert b.samples[0].versions == [1, 1] and b.samples[0].steps == b_steps
        assert sim.updates == [landed]
        assert u.landed_tick == (3 if in_flight else 5)


def test_lock_step_keeps_the_arrival_order_in_flight_does_not():
    """1 slot; A (2 tokens) and B (1 token) arrive, then the update to v1. Lock-step: A ticks 1-2, B tick 3, all v0;
    the update lands at tick 4 (after 3 steps), a tick with nothing to decode. In flight: the update lands at tick 1
    before the first step: every token v1, B at tick 3."""
    lock = SlotSim(1, in_flight=False)
    a, b = lock.add([2]), lock.add([1])
    lock.post(1)
    run(lock, 4)
    assert (a.samples[0].versions, b.samples[0].versions) == ([0, 0], [0])
    assert lock.updates == [(1, 3)] and lock.zero_ticks == 1

    fl = SlotSim(1, in_flight=True)
    a, b = fl.add([2]), fl.add([1])
    fl.post(1)
    run(fl, 3)
    assert (a.samples[0].versions, b.samples[0].versions) == ([1, 1], [1])
    assert b.samples[0].steps == [3] and fl.updates == [(1, 0)]


def test_a_load_takes_ticks_in_which_nothing_decodes():
    """load_ticks 2. In flight, 1 slot: A (3 tokens) decodes at tick 1 (v0); v1 arrives, loads in ticks 2-3 (A keeps
    its slot: no zero tick), lands at tick 3; A's last tokens at ticks 4-5 (v1): versions [0, 1, 1], done at tick 5,
    3 steps and 3 busy slot-steps in 5 ticks: idle 1 - 3 / 5 = 0.4.
    Lock-step, 1 slot: A (2 tokens) ticks 1-2; v1 arrived during tick 1 loads in ticks 3-4 with no sample in a slot
    (2 zero ticks), lands at tick 4; B, arrived after v1, enters at tick 5 under v1."""
    fl = SlotSim(1, in_flight=True, load_ticks=2)
    a = fl.add([3])
    run(fl, 1)
    u = fl.post(1)
    run(fl, 4)
    assert a.samples[0].versions == [0, 1, 1] and a.samples[0].steps == [1, 2, 3]
    assert (a.done_tick, u.landed_tick, fl.zero_ticks) == (5, 3, 0)
    assert (fl.ticks, fl.steps, fl.busy) == (5, 3, 3) and fl.updates == [(1, 1)]

    lock = SlotSim(1, in_flight=False, load_ticks=2)
    a = lock.add([2])
    run(lock, 1)
    u = lock.post(1)
    b = lock.add([1])
    run(lock, 4)
    assert a.samples[0].versions == [0, 0] and b.samples[0].versions == [1]
    assert (u.landed_tick, b.done_tick, lock.zero_ticks, lock.steps) == (4, 5, 2, 3)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="slots=0"):
        SlotSim(0, in_flight=True)
    with pytest.raises(ValueError, match="length must be >= 1"):
        SlotSim(1, in_flight=True).add([2, 0])


# -- the threaded engine ---------------------------------------------------------------------------------------
def engine(in_flight: bool, **kw) -> SlotEngine:
    args = dict(slots=2, dt_s=0.001, short=40, long_frac=0.0, in_flight=in_flight)
    return SlotEngine("m", log=CallLog(), role="engine0", **{**args, **kw})


def prompts(n: int, cap: int | None = None) -> list[Prompt]:
    return [Prompt(index=i, text="", prompt_ids=[1, 2], gold="g", max_new_tokens=cap) for i in range(n)]


def in_thread(fn, *args):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    return t, out


def wait_steps(eng: SlotEngine, steps: int) -> None:
    deadline = time.monotonic() + 5
    while eng.sim.steps < steps and time.monotonic() < deadline:
        time.sleep(0.001)


def test_in_flight_an_update_lands_mid_request_and_every_token_says_which_version_sampled_it():
    """One prompt, 2 samples of 40 tokens; the update to v1 posted after at least 5 steps lands between two steps:
    each completion's token_versions is k zeros then 40 - k ones, k = the steps taken when it landed
    (``sim.updates``); policy_version 0 (the oldest); text the gold for sample 0; stop (40 < 100)."""
    eng = engine(True)
    try:
        t, out = in_thread(eng.generate, prompts(1), SamplingConfig(n=2, max_new_tokens=100, seed=3))
        wait_steps(eng, 5)
        assert eng.receive_weights([], 1) == 1.0
        t.join(5)
        (c0, c1), ((v, k),) = out[0], eng.sim.updates
        assert v == 1 and 5 <= k < 40
        assert c0.token_versions == c1.token_versions == [0] * k + [1] * (40 - k)
        assert (c0.policy_version, c0.finish_reason, c0.text, c1.text) == (0, "stop", "g", "wrong")
        assert eng.get_policy_version() == 1 and set(eng.marks) == {1}
    finally:
        eng.shutdown()


def test_lock_step_an_update_waits_for_the_running_call():
    """Lock-step: receive_weights called while a 40-token batch runs returns only after it ends: every token v0,
    no token_versions (as the lock-step vLLM engine), the update landed after all 40 steps."""
    eng = engine(False)
    try:
        t, out = in_thread(eng.generate, prompts(1), SamplingConfig(n=2, max_new_tokens=100, seed=3))
        wait_steps(eng, 5)
        eng.receive_weights([], 1)
        assert eng.sim.updates == [(1, 40)]
        t.join(5)
        assert [(c.policy_version, c.token_versions, len(c.token_ids)) for c in out[0]] == [(0, None, 40)] * 2
    finally:
        eng.shutdown()


def test_the_length_mix_is_seeded_and_capped():
    """long_frac 1: every sample short x long_mult = 40 x 8 = 320 tokens, cut at the prompt's cap 50 (finish
    length); long_frac 0.1: the same seed draws the same lengths in both modes, about 10% of 2000 samples long."""
    eng = engine(True, long_frac=1.0, dt_s=0.0005, short=5, slots=4)
    try:
        out = eng.generate(prompts(2, cap=12), SamplingConfig(n=2, max_new_tokens=100, seed=0))
        assert [(len(c.token_ids), c.finish_reason) for c in out] == [(12, "length")] * 4
    finally:
        eng.shutdown()
    a, b = engine(False, long_frac=0.1), engine(True, long_frac=0.1)
    try:
        ps = prompts(500)
        la = [a._length(7, p, j, 10**6) for p in ps for j in range(4)]
        assert la == [b._length(7, p, j, 10**6) for p in ps for j in range(4)]
        assert set(la) == {40, 320} and 0.08 < la.count(320) / len(la) < 0.12
        assert la != [a._length(8, p, j, 10**6) for p in ps for j in range(4)]  # another seed, other draws
    finally:
        a.shutdown()
        b.shutdown()


def test_usage_over_two_marks():
    """Marks (ticks, busy slot-steps, zero ticks, wall s) (10, 0, 2, 0.0) and (20, 15, 5, 2.0), 2 slots, dt 0.1 s:
    idle 1 - 15 / (2 x 10) = 0.25, zero 3 / 10 = 0.3, clock rate 10 x 0.1 / 2.0 = 0.5 (the clock ran at half
    speed)."""
    eng = engine(True, dt_s=0.1)
    try:
        eng.marks = {0: (10, 0, 2, 0.0), 1: (20, 15, 5, 2.0)}
        assert eng.usage(0, 1) == pytest.approx({"idle": 0.25, "zero": 0.3, "ticks": 10.0, "clock_rate": 0.5})
    finally:
        eng.shutdown()


def test_shutdown_releases_a_waiting_call():
    """A call still running when the engine shuts down raises (the run's end with batches in flight) instead of
    hanging its thread."""
    eng = engine(True, dt_s=0.05, short=1000)
    t, out = in_thread(lambda: pytest.raises(RuntimeError, eng.generate, prompts(1),
                                             SamplingConfig(n=1, max_new_tokens=2000)))  # fmt: skip
    wait_steps(eng, 1)
    eng.shutdown()
    t.join(5)
    assert not t.is_alive() and "shut down" in str(out[0].value)
