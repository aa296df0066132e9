"""In-flight weight updates on a scripted engine (:mod:`rlvr.rollout.inflight`): updates injected at chosen decode
steps, the per-token versions and behaviour logprobs worked out by hand, one test per version fault reported against
other frameworks (AReaL #1569, rllm #622, labs-molt #124, Miles #2589), a trajectory spanning two updates, and the
decoupled-PPO weights on it by hand.

The scripted core (:class:`ScriptedCore`) stands for vLLM's ``LLMEngine``: each ``step()`` gives every running
request one token, id 10 + its position, with the logprob the loaded weights ``w`` give it, ``lp(w, pos) =
-(w + 1) - pos / 100`` (so a token's logprob names the weights that sampled it); request ``k`` of a batch stops
after its ``max_tokens``. ``at_step[k]`` runs a hook inside step k (1-based), before its tokens: a test posts an
update there, which the loop runs after step k and before step k + 1 -- exactly as a sync arriving during step k.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from rlvr.rollout.inflight import EngineLoop, EngineLoopError


def lp(w: int, pos: int) -> float:
    return -(w + 1) - pos / 100


class ScriptedCore:
    """``suffix``: the engine's own request ids are the given ones plus it (vLLM appends a random suffix), returned by
    ``add_request`` and used on its outputs; ``stray``: an output of a request the loop never submitted comes first in
    every step; ``bare``: outputs without logprobs or text, finished with no reason; ``prompt_lps``: each request's
    outputs carry these prompt logprobs (a new list each step: the loop keeps the first)."""

    def __init__(self, suffix: str = "", stray: bool = False, bare: bool = False, prompt_lps: list | None = None) -> None:
        self.suffix, self.stray, self.bare, self.prompt_lps = suffix, stray, bare, prompt_lps
        self.weights = 0  # what a "load" sets
        self.running: list[dict] = []  # in submission order
        self.at_step: dict[int, object] = {}
        self.calls = 0
        self.added: list[tuple[str, dict]] = []  # (request id, prompt) as the engine got them
        self.resets: list[tuple[int, bool]] = []  # (running requests, reset_running_requests) per reset

    def add_request(self, request_id, prompt, params, lora_request=None):
        self.added.append((request_id, prompt))
        self.running.append({"id": request_id + self.suffix, "max": params.max_tokens, "pos": 0})
        return request_id + self.suffix

    def step(self):
        self.calls += 1
        hook = self.at_step.get(self.calls)
        if hook is not None:
            hook()
        outs = []
        if self.stray:  # another request's output (one the loop does not know): skipped, the rest still read
            outs.append(SimpleNamespace(request_id="other-7", finished=True, prompt_logprobs=None,
                                        outputs=[SimpleNamespace(token_ids=[99], logprobs=None, text="?",
                                                                 finish_reason="stop")]))  # fmt: skip
        for r in list(self.running):
            pos = r["pos"]
            r["pos"] += 1
            done = r["pos"] >= r["max"]
            tok = 10 + pos
            lps = None if self.bare else [{tok: SimpleNamespace(logprob=lp(self.weights, pos))}]
            reason = None if self.bare else ("length" if done else None)
            outs.append(SimpleNamespace(
                request_id=r["id"], finished=done,
                prompt_logprobs=None if self.prompt_lps is None else [*self.prompt_lps, pos],
                outputs=[SimpleNamespace(token_ids=[tok], logprobs=lps, text=None if self.bare else f"<{pos}>",
                                         finish_reason=reason)]))  # fmt: skip
            if done:
                self.running.remove(r)
        return outs

    def reset_prefix_cache(self, reset_running_requests=False):
        self.resets.append((len(self.running), reset_running_requests))
        return True


def params(n: int):
    return SimpleNamespace(max_tokens=n)


def load(core: ScriptedCore, w: int):
    def f():
        core.weights = w
        return f"loaded {w}"

    return f


@pytest.fixture
def core_loop():
    core = ScriptedCore()
    loop = EngineLoop(core)
    yield core, loop
    loop.close()


def update_at(core: ScriptedCore, loop: EngineLoop, step: int, version: int, futures: list | None = None) -> None:
    """Post the update to ``version`` during step ``step``: it lands after that step."""

    def hook():
        f = loop.update(load(core, version), version)
        if futures is not None:
            futures.append(f)

    core.at_step[step] = hook


def test_each_token_carries_the_version_that_sampled_it(core_loop):
    """AReaL #1569 (a token labelled with a version that did not sample it). One request of 6 tokens; updates
    posted during steps 2 and 4: tokens 0-1 sampled by v0, 2-3 by v1, 4-5 by v2; each logprob is the one the
    sampling weights gave (lp(w, pos) by hand)."""
    core, loop = core_loop
    done = []
    update_at(core, loop, 2, 1, done)
    update_at(core, loop, 4, 2, done)
    (out,) = loop.submit([([1, 2, 3], params(6))]).result(timeout=10)
    assert out.token_ids == [10, 11, 12, 13, 14, 15]
    assert out.versions == [0, 0, 1, 1, 2, 2]
    assert out.logprobs == [-1.0, -1.01, -2.02, -2.03, -3.04, -3.05]
    assert out.steps == [1, 2, 3, 4, 5, 6]
    assert out.text == "<0><1><2><3><4><5>"
    assert [f.result(timeout=5) for f in done] == ["loaded 1", "loaded 2"]
    assert loop.updates == [(1, 2), (2, 4)] and loop.version == 2
    assert out.finish_reason == "length"


def test_the_version_is_never_read_after_generation(core_loop):
    """rllm #622 (the version read when the rollout returns, so a sync during generation relabels old samples). A
    batch of a 2-token and a 5-token request, the update to v1 posted during step 3: the short one (finished at step
    2) is all v0; the long one keeps v0 on its first 3 tokens although it ends under v1. Through the engine's
    Completion, each sample's ``policy_version`` is its oldest token's: 0 for both, never 1."""
    from rlvr.rollout.vllm_engine import VLLMEngine
    from rlvr.types import Prompt, SamplingConfig

    core, loop = core_loop
    update_at(core, loop, 3, 1)
    short, long_ = loop.submit([([1], params(2)), ([1], params(5))]).result(timeout=10)
    assert short.versions == [0, 0]
    assert long_.versions == [0, 0, 0, 1, 1]
    assert long_.logprobs == [-1.0, -1.01, -1.02, -2.03, -2.04]

    # the engine's own path (VLLMEngine._generate_in_flight) on the same loop: Completion fields
    eng = object.__new__(VLLMEngine)
    eng.loop, eng._lora, eng.policy_version = loop, None, 1
    core.at_step[core.calls + 2] = lambda: loop.update(load(core, 2), 2)  # lands after the batch's 2nd step
    vparams = SimpleNamespace(clone=lambda: SimpleNamespace(max_tokens=3, clone=lambda: SimpleNamespace(max_tokens=3)))
    comps = eng._generate_in_flight([Prompt(index=7, text="", prompt_ids=[1, 2], gold="x")],
                                    SamplingConfig(n=2, max_new_tokens=3), vparams)  # fmt: skip
    assert [c.token_versions for c in comps] == [[1, 1, 2], [1, 1, 2]]
    assert [c.policy_version for c in comps] == [1, 1]
    assert [c.logprobs for c in comps] == [[-2.0, -2.01, -3.02]] * 2
    assert [(c.prompt_index, c.sample_index) for c in comps] == [(7, 0), (7, 1)]


def test_a_rollout_that_mixes_versions_says_so(core_loop):
    """labs-molt #124 (one rollout silently mixing two versions). Four requests of 4 tokens, the update posted
    during step 2, a second batch submitted after it: the first batch's samples each span v0 -> v1 (tokens 0, 1 by
    v0, 2, 3 by v1); the metrics say it: async/spanning_frac 4/6 over both batches, the per-token histogram
    (trainer at v1): 8 of 24 tokens one version behind; per sample, by the oldest token: 4 of 6 at lag 1."""
    from rlvr.metrics import names as mn
    from rlvr.metrics.timeline import staleness_metrics
    from rlvr.types import Completion

    core, loop = core_loop
    first = loop.submit([([1], params(4)) for _ in range(4)])
    update_at(core, loop, 2, 1)
    outs = first.result(timeout=10)
    outs += loop.submit([([1], params(4)) for _ in range(2)]).result(timeout=10)
    assert [o.versions for o in outs] == [[0, 0, 1, 1]] * 4 + [[1, 1, 1, 1]] * 2
    comps = [Completion(prompt_index=i, sample_index=0, prompt_ids=[1], token_ids=o.token_ids, logprobs=o.logprobs,
                        text=o.text, finish_reason="length", policy_version=min(o.versions), token_versions=o.versions)
             for i, o in enumerate(outs)]  # fmt: skip
    m = staleness_metrics(comps, 1, 2)
    assert m[mn.ASYNC_SPANNING_FRAC] == pytest.approx(4 / 6)
    assert m[mn.token_staleness(1)] == pytest.approx(8 / 24) and m[mn.token_staleness(0)] == pytest.approx(16 / 24)
    assert m[mn.staleness(1)] == pytest.approx(4 / 6)
    # the second batch was submitted under v1: its prompts' prefix cache is salted v1, the first batch's v0
    assert [p["cache_salt"] for _, p in core.added] == ["rlvr-v0"] * 4 + ["rlvr-v1"] * 2
    assert [p["prompt_token_ids"] for _, p in core.added] == [[1]] * 6
    assert len({rid for rid, _ in core.added}) == 6  # every request its own id


def test_an_update_aborts_nothing(core_loop):
    """Miles #2589 (every update aborts every in-flight request, dropping whole groups). Two batches of three
    requests (lengths 3, 5, 8 and 2, 4, 6), updates posted during steps 1, 3 and 6: every request runs to its length,
    ends ``length``, in its batch's order; versions by hand."""
    core, loop = core_loop
    for step, v in ((1, 1), (3, 2), (6, 3)):
        update_at(core, loop, step, v)
    a = loop.submit([([1], params(n)) for n in (3, 5, 8)])
    b = loop.submit([([2], params(n)) for n in (2, 4, 6)])
    outs = a.result(timeout=10) + b.result(timeout=10)
    assert [len(o.token_ids) for o in outs] == [3, 5, 8, 2, 4, 6]
    assert all(o.finish_reason == "length" for o in outs)
    # both batches join at step 1 (submitted before the loop's first step or at its second: read off .steps)
    first_step = [o.steps[0] for o in outs]
    version_at = {1: 0}  # the version each step ran with: v1 from step 2, v2 from step 4, v3 from step 7
    for s in range(2, 20):
        version_at[s] = 1 if s < 4 else 2 if s < 7 else 3
    for o, s0 in zip(outs, first_step):
        assert o.versions == [version_at[s] for s in range(s0, s0 + len(o.token_ids))]
    assert core.resets == []  # keep: no request preempted


def test_recompute_preempts_the_running_requests_and_keeps_their_labels():
    """``kv="recompute"``: an update resets the prefix cache with the running requests preempted (vLLM recomputes
    their prefix under the new weights); their tokens so far keep the labels and logprobs of the version that
    sampled them."""
    core = ScriptedCore()
    loop = EngineLoop(core, kv="recompute")
    try:
        update_at(core, loop, 2, 1)
        (o,) = loop.submit([([1], params(4))]).result(timeout=10)
        assert o.versions == [0, 0, 1, 1] and o.logprobs == [-1.0, -1.01, -2.02, -2.03]
        assert core.resets == [(1, True)]
    finally:
        loop.close()
    with pytest.raises(ValueError, match="in_flight_kv"):
        EngineLoop(ScriptedCore(), kv="drop")


def test_a_trajectory_spanning_two_updates_and_its_decoupled_weights():
    """A two-turn trajectory whose first turn spans the update to v1 (posted during its step 2) and whose second
    turn spans v1 -> v2: turn 1 tokens [10, 11, 12] by v0, v0, v1; the environment's 2 tokens; turn 2 [10, 11] by v1,
    v2. Completion.token_versions [0, 0, 1, -1, -1, 1, 2], policy_version 0 (the oldest), versions() the 5 sampled.

    The decoupled PPO weights (Fu et al. 2025, eq. 5: w = pi_prox / pi_behav per token) on it, with the trainer's
    proximal logprobs chosen as -1.5 on every token: behaviour logprobs by hand -1.0, -1.01, -2.02, (env), -2.0,
    -3.01 -> w = e^-0.5, e^-0.49, e^0.52, 0, 0, e^0.5, e^1.51 (env tokens masked); capped at 4: e^1.51 = 4.53 > 4
    leaves the loss (w = 0)."""
    from rlvr.algos.losses import _rollout_correction
    from rlvr.envs.turns import Segment
    from rlvr.train.batch import pack
    from rlvr.types import Completion

    core = ScriptedCore()
    loop = EngineLoop(core)
    try:
        update_at(core, loop, 2, 1)
        (t1,) = loop.submit([([1, 2], params(3))]).result(timeout=10)
        update_at(core, loop, core.calls + 1, 2)  # during turn 2's first step
        (t2,) = loop.submit([([1, 2, 10, 11, 12, 40, 41], params(2))]).result(timeout=10)
    finally:
        loop.close()
    seg = Segment(prompt_ids=[1, 2])
    seg.add(t1.token_ids, t1.logprobs, t1.versions)
    seg.add([40, 41], None)
    seg.add(t2.token_ids, t2.logprobs, t2.versions)
    c = Completion(prompt_index=0, sample_index=0, prompt_ids=seg.prompt_ids, token_ids=seg.ids, logprobs=seg.logprobs,
                   text="", finish_reason="stop", policy_version=min(v for v in seg.versions if v >= 0),
                   loss_mask=seg.mask, token_versions=seg.versions, turns=2)  # fmt: skip
    assert c.token_versions == [0, 0, 1, -1, -1, 1, 2]
    assert c.policy_version == 0 and c.versions() == [0, 0, 1, 1, 2]
    assert c.logprobs == [-1.0, -1.01, -2.02, 0.0, 0.0, -2.0, -3.01]

    batch = pack([c], torch.zeros(1), pad_id=0, max_new_tokens=8)
    mask = batch.loss_mask
    prox = torch.full_like(batch.rollout_logprobs, -1.5) * mask
    w, _ = _rollout_correction(prox, batch.rollout_logprobs, mask, 0.0, "decoupled")
    resp = slice(1, 8)  # position lp - 1 = 1 predicts response token 0
    e = torch.exp(torch.tensor([-0.5, -0.49, 0.52, 0.0, 0.0, 0.5, 1.51]))
    want = torch.where(torch.tensor([1, 1, 1, 0, 0, 1, 1]).bool(), e, torch.zeros(7))
    assert torch.allclose(w[0, resp] * mask[0, resp], want, atol=1e-5)
    w4, _ = _rollout_correction(prox, batch.rollout_logprobs, mask, 4.0, "decoupled")
    assert torch.allclose(w4[0, resp] * mask[0, resp], torch.where(want > 4, torch.zeros(7), want), atol=1e-5)
    assert float(w4[0, 7]) == 0.0 and float(w[0, 7]) == pytest.approx(4.5267, abs=1e-3)


def test_a_failed_step_fails_every_waiting_batch_loudly():
    """A step that raises (the engine broke) answers every waiting batch and later submission with
    :class:`EngineLoopError` naming the cause; nothing waits forever."""
    core = ScriptedCore()

    def boom():
        raise RuntimeError("CUDA error: device lost")

    core.at_step[2] = boom
    loop = EngineLoop(core)
    a = loop.submit([([1], params(5))])
    with pytest.raises(EngineLoopError, match="device lost"):
        a.result(timeout=10)
    with pytest.raises(EngineLoopError, match="device lost"):
        loop.submit([([1], params(2))])
    loop.close()


def test_jobs_run_between_steps_in_the_loop_thread(core_loop):
    """A job (e.g. prompt logprobs, the probe, a read-back) runs in the loop's own thread, never during a step."""
    core, loop = core_loop
    seen = []
    core.at_step[1] = lambda: seen.append(loop.call(lambda: (threading.current_thread().name, core.calls)))
    loop.submit([([1], params(3))]).result(timeout=10)
    name, calls = seen[0].result(timeout=5)
    assert name.endswith("-loop") and calls == 1  # after step 1, before step 2


def test_pack_carries_token_versions_and_the_trainer_reports_the_gap_by_age():
    """``pack`` puts each sampled token's version at its loss position (-1 off the mask, environment tokens
    included); the trainer's ``_gap_by_age`` sums the rollout gap per token age (trainer version - token version):
    by hand, trainer at v3, tokens of versions [3, 2, 2, 1] with gaps [0.1, 0.2, 0.4, 0.8] and a second sample
    [3, -1(env), 3] with [0.3, 9.0, 0.5]: age 0 -> (0.1 + 0.3 + 0.5, 3), age 1 -> (0.6, 2), age 2 -> (0.8, 1)."""
    from rlvr.metrics import names as mn
    from rlvr.train.batch import pack
    from rlvr.train.policy import _gap_by_age
    from rlvr.types import Completion

    a = Completion(prompt_index=0, sample_index=0, prompt_ids=[1, 2], token_ids=[5, 6, 7, 8], logprobs=[-1.0] * 4,
                   text="", finish_reason="stop", policy_version=1, token_versions=[3, 2, 2, 1])
    b = Completion(prompt_index=0, sample_index=1, prompt_ids=[1], token_ids=[5, 9, 6], logprobs=[-1.0, 0.0, -1.0],
                   text="", finish_reason="stop", policy_version=3, token_versions=[3, -1, 3], loss_mask=[1, 0, 1])
    old = Completion(prompt_index=1, sample_index=0, prompt_ids=[1], token_ids=[5], logprobs=[-1.0], text="",
                     finish_reason="stop", policy_version=2)  # no per-token versions: its policy_version
    batch = pack([a, b, old], torch.zeros(3), pad_id=0, max_new_tokens=4)
    assert batch.versions.tolist() == [[-1, 3, 2, 2, 1], [3, -1, 3, -1, -1], [2, -1, -1, -1, -1]]
    assert batch.select([1]).versions.tolist() == [[3, -1, 3]]
    gap = torch.tensor([[0.0, 0.1, 0.2, 0.4, 0.8], [0.3, 9.0, 0.5, 0.0, 0.0], [0.7, 0, 0, 0, 0]])
    got = _gap_by_age(gap[:2], batch.versions[:2], batch.loss_mask[:2], 3)
    assert got.keys() == {mn.rollout_gap_age(0), mn.rollout_gap_age(1), mn.rollout_gap_age(2)}
    assert got[mn.rollout_gap_age(0)] == (pytest.approx(0.9), 3.0)
    assert got[mn.rollout_gap_age(1)] == (pytest.approx(0.6), 2.0)
    assert got[mn.rollout_gap_age(2)] == (pytest.approx(0.8), 1.0)


def test_a_weight_load_runs_without_the_step_lock():
    """Engines sharing a process share one step lock (vLLM's forward context, ``FORWARD_LOCK``) and all take part in
    one broadcast: a weight load holding the lock would deadlock the second engine's load. The load runs without
    it; a forward job (prompt logprobs, the probe) and the recompute reset run with it."""
    lock = threading.Lock()
    core = ScriptedCore()
    loop = EngineLoop(core, kv="recompute", step_lock=lock)
    try:
        held = {}

        def load_job():
            held["load"] = lock.locked()

        update_at(core, loop, 1, 1)
        core.at_step[1] = lambda: loop.update(load_job, 1)
        loop.submit([([1], params(3))]).result(timeout=10)
        assert held == {"load": False}
        assert loop.call(lambda: lock.locked()).result(timeout=5) is True  # a forward job holds it
        assert loop.call(lambda: lock.locked(), forward=False).result(timeout=5) is False
    finally:
        loop.close()


def test_the_engines_own_ids_stray_outputs_and_bare_outputs():
    """vLLM answers under its own request ids (the given id plus a suffix): the loop maps them; an output of a
    request it never submitted is skipped and the rest of the step still read; an output without logprobs gives
    0.0 per token, without text "", finished without a reason ``abort``; prompt logprobs are the first output's."""
    core = ScriptedCore(suffix="-a1b2", stray=True, prompt_lps=[None, -0.5])
    loop = EngineLoop(core)
    try:
        (o,) = loop.submit([([1, 2], params(3))]).result(timeout=10)
        assert o.token_ids == [10, 11, 12] and o.versions == [0, 0, 0] and o.finish_reason == "length"
        assert o.prompt_logprobs == [None, -0.5, 0]  # the first step's list, not a later one's
    finally:
        loop.close()
    core = ScriptedCore(bare=True)
    loop = EngineLoop(core)
    try:
        (o,) = loop.submit([([1], params(2))]).result(timeout=10)
        assert o.logprobs == [0.0, 0.0] and o.text == "" and o.finish_reason == "abort"
    finally:
        loop.close()


def test_a_job_waiting_when_the_loop_fails_gets_the_error():
    """A job queued behind a failing step is answered with :class:`EngineLoopError`, never left waiting."""
    core = ScriptedCore()
    loop = EngineLoop(core)
    waiting = []

    def boom():
        waiting.append(loop.call(lambda: "never"))
        raise RuntimeError("engine core died")

    core.at_step[1] = boom
    a = loop.submit([([1], params(3))])
    with pytest.raises(EngineLoopError, match="engine core died"):
        a.result(timeout=10)
    with pytest.raises(EngineLoopError, match="engine core died"):
        waiting[0].result(timeout=10)
    loop.close()


def test_usage_splits_the_loops_time_into_steps_loads_and_waiting():
    """``usage()``: a core whose step sleeps 20 ms, 3 steps and one load of 50 ms: step_s ~ 0.06, load_s ~ 0.05,
    within a window that holds both; the next call starts from zero."""
    import time as _t

    core = ScriptedCore()
    orig = core.step
    core.step = lambda: (_t.sleep(0.02), orig())[1]
    loop = EngineLoop(core)
    try:
        loop.usage()
        core.at_step[1] = lambda: loop.update(lambda: _t.sleep(0.05), 1)
        loop.submit([([1], params(3))]).result(timeout=10)
        u = loop.usage()
        assert 0.06 <= u["step_s"] < 0.2 and 0.05 <= u["load_s"] < 0.15
        assert u["window_s"] >= u["step_s"] + u["load_s"] and u["job_s"] < 0.01
        again = loop.usage()
        assert again["step_s"] == 0.0 and again["load_s"] == 0.0
    finally:
        loop.close()


def test_only_an_engine_that_steps_in_this_thread_runs_in_flight():
    """A core in another process (vLLM's default on GPU) or a batch queue (async scheduling) samples tokens beside
    a weight load run between two step() calls: refused by name; the in-process core without a queue passes, and so
    do scripted cores."""
    from collections import deque

    from vllm.v1.engine.core_client import InprocClient, SyncMPClient

    from rlvr.rollout.inflight import require_lockstep_core
    from rlvr.rollout.vllm_engine import construction_env

    inproc = InprocClient.__new__(InprocClient)
    inproc.engine_core = SimpleNamespace(batch_queue=None)
    require_lockstep_core(SimpleNamespace(engine_core=inproc))
    require_lockstep_core(SimpleNamespace(step=lambda: []))
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0.*SyncMPClient"):
        require_lockstep_core(SimpleNamespace(engine_core=SyncMPClient.__new__(SyncMPClient)))
    inproc.engine_core = SimpleNamespace(batch_queue=deque(maxlen=2))
    with pytest.raises(ValueError, match="async_scheduling=False"):
        require_lockstep_core(SimpleNamespace(engine_core=inproc))
    # and the engine is built that way on GPU too (the CPU build always has the core in process)
    assert construction_env(True, 1, 0, (), in_flight=True) == ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, ())
    assert construction_env(True, 1, 0) == ({}, ())
    assert construction_env(False, 1, 0, (), in_flight=True)[0]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
