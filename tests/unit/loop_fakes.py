"""Fakes of the four roles for millisecond loop tests: the real controller (:func:`rlvr.runtime.controller.train`,
:class:`rlvr.runtime.roles.Roles`) drives them through the real in-process executor, and each records its calls in
one shared log, so a test can assert the order of a step (generate -> score -> update -> sync) without vLLM,
DeepSpeed or verifier processes.

- engine: answers each prompt's G samples with the gold for even sample indices and "wrong" for odd ones (every
  sample right in its first ``all_right_calls`` calls: groups without signal); or (``FakeExecutor(slot_engine=)``)
  :class:`SlotEngine`, a continuous-batching engine on a simulated clock (:class:`SlotSim`): C slots, a long-tail
  length mix, lock-step or in-flight weight updates, busy slot-steps counted;
- scorer: 1.0 when the text equals the gold, else 0.0, under the recipe's first verifier key;
- trainer: one fixed weight spec (w = [1.0]), a constant checksum and probe logprobs equal to the engine's (sync
  checks pass: checksum, read-back and probe);
  ``train_step`` counts the batch's sequences;
- critic: values of zero;
- judge: the verdict ``\\boxed{0}`` (step 0 is flawed) for every item, parsed by the item's rule;
- teacher: logprob -0.5 for every token it scores (the engine's are -1.0).
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from rlvr.reward.pool import Scored, verifier_keys
from rlvr.runtime.executors import LocalExecutor, Resources
from rlvr.types import Completion, VerifyResult

SPECS = [("w", (1,), "float32")]


class CallLog:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []  # (role, method)
        self._lock = threading.Lock()

    def add(self, role: str, method: str) -> None:
        with self._lock:
            self.calls.append((role, method))

    def methods(self, *keep: str) -> list[str]:
        return [m for _, m in self.calls if m in keep]


class FakeEngine:
    def __init__(self, model_dir: str, *, log: CallLog, role: str, all_right_calls: int = 0, delay_s: float = 0.0,
                 stale_call: int = -1, sync_s: float = 0.0, seeded: bool = False, **_: Any) -> None:
        self.log, self.role, self.version, self.all_right_calls, self.seeded = log, role, 0, all_right_calls, seeded
        self.delay_s, self.stale_call, self.calls, self.sync_s = delay_s, stale_call, 0, sync_s
        self.versions: list[int] = []  # the policy version each generate call reported

    def generate(self, prompts, sampling):
        self.log.add(self.role, "generate")
        # a sequence of delays: one per call, cycled (uneven stage times)
        time.sleep(self.delay_s if isinstance(self.delay_s, (int, float)) else self.delay_s[self.calls % len(self.delay_s)])
        right = self.all_right_calls > 0  # the first ``all_right_calls`` calls answer every sample right
        self.all_right_calls -= 1
        # call ``stale_call`` (0-based) claims a policy version far in the past (as an engine left behind would),
        # and answers every sample wrong (so that its rewards differ from its regeneration's)
        stale = self.calls == self.stale_call
        version = self.version - 100 if stale else self.version
        self.calls += 1
        self.versions.append(version)

        def ok(p, j):  # seeded: which samples are right depends on the call's seed (each batch differs)
            if stale:
                return False
            if self.seeded and sampling.seed is not None:
                return random.Random(f"{sampling.seed}-{p.index}-{j}").random() < (sampling.seed % 5 + 1) / 6
            return right or j % 2 == 0

        return [Completion(prompt_index=p.index, sample_index=j, prompt_ids=list(p.prompt_ids),
                           token_ids=[5, 6], logprobs=[-1.0, -1.0], text=p.gold if ok(p, j) else "wrong",
                           finish_reason="stop", policy_version=version)
                for p in prompts for j in range(sampling.n)]  # fmt: skip

    def probe_logprobs(self, prompt_ids, n_tokens):
        return [5] * n_tokens, [-1.0] * (len(prompt_ids) - 1 + n_tokens)

    def expected_weights(self):
        return {n: s for n, s, _ in SPECS}

    def init_weight_sync(self, *args):
        return True

    def receive_weights(self, specs, version, bucket_mb=0.0):
        self.log.add(self.role, "receive_weights")
        time.sleep(self.sync_s)
        self.version = version
        return 1.0

    def loop_usage(self):  # no engine loop (the controller then reports no async/engine_* metric)
        return {}

    def loaded_blocks(self, names, dtype):  # one worker holding w = [1.0], as the fake trainer sends it
        return [[("w", 0, 1, 0, 1, "float32", torch.ones(1).numpy().tobytes())]]

    def get_policy_version(self):
        return self.version

    def ping(self):
        return True


# -- a continuous-batching engine on a simulated clock (benchmarks/async_speedup.py part 1c) ---------------------
class SimSample:
    """One sample of a batch: ``length`` tokens to decode; ``versions`` [t] the policy version of each decoded token,
    ``steps`` [t] the decode step (1-based, :attr:`SlotSim.steps`) that decoded it."""

    def __init__(self, length: int, batch: "SimBatch") -> None:
        self.length, self.batch = length, batch
        self.versions: list[int] = []
        self.steps: list[int] = []


class SimBatch:
    """One ``generate`` call's samples; ``arrived_tick``: the ticks elapsed when it arrived; ``done_tick``: the tick
    its last sample finished at (None: running)."""

    def __init__(self, lengths: list[int], arrived_tick: int = 0) -> None:
        self.arrived_tick = arrived_tick
        self.samples = [SimSample(n, self) for n in lengths]
        self.queued = deque(self.samples)  # not yet in a slot
        self.left = len(self.samples)
        self.done_tick: int | None = None
        self.event = threading.Event()  # set when done (SlotEngine)


class SimUpdate:
    """A posted weight update to ``version``; ``landed_tick``: the tick its load ended at (None: not yet)."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.landed_tick: int | None = None
        self.event = threading.Event()  # set when landed (SlotEngine)


class SlotSim:
    """The schedule of a continuous-batching engine (a GPU vLLM) on a clock of ticks, with no threads and no wall
    time: the core of :class:`SlotEngine`, driven by hand in tests.

    ``slots`` C samples decode at once, one token each per decode step; each :meth:`tick` is one step's time. In a
    tick: a weight update that may land starts loading (``load_ticks`` ticks in which nothing decodes; 0: it lands
    at once, before the tick's step), else the free slots take waiting samples and every running sample decodes
    one token, labelled with the loaded version. What may enter:

    - lock-step (``in_flight`` False, vLLM's ``LLM.generate``): batches and updates in arrival order, one at a time:
      a batch's samples run alone (the next batch waits until its last sample ends, however many slots are free),
      an update lands when the batch before it has ended;
    - in flight (continuous batching across calls): a free slot takes the oldest waiting sample of any batch; an
      update lands at the next tick, whatever runs (the running samples keep their slots, their next tokens carry
      the new version).

    Counters: ``ticks`` elapsed, ``steps`` decode steps taken (ticks with a sample decoding), ``busy`` busy
    slot-steps (tokens decoded), ``zero_ticks`` ticks with no sample in a slot, ``updates`` (version, ``steps``
    when it landed). The engine's idle share over ticks a..b is 1 - busy / (C x (b - a)). Errors: ``ValueError``
    for ``slots`` < 1, ``load_ticks`` < 0, a length < 1."""

    def __init__(self, slots: int, in_flight: bool, load_ticks: int = 0, version: int = 0) -> None:
        if slots < 1 or load_ticks < 0:
            raise ValueError(f"SlotSim: slots={slots} must be >= 1 and load_ticks={load_ticks} >= 0")
        self.slots, self.in_flight, self.load_ticks, self.version = slots, in_flight, load_ticks, version
        self.ticks = self.steps = self.busy = self.zero_ticks = 0
        self.updates: list[tuple[int, int]] = []
        self.running: list[SimSample] = []
        self._fifo: deque[SimBatch | SimUpdate] = deque()  # arrival order
        self._loading: list[Any] | None = None  # [update, ticks left]

    def add(self, lengths: list[int]) -> SimBatch:
        """A batch of samples of these lengths (tokens) arrives; it enters at the next tick."""
        if any(n < 1 for n in lengths):
            raise ValueError(f"SlotSim.add: every length must be >= 1, got {lengths}")
        b = SimBatch(list(lengths), self.ticks)
        if b.left == 0:
            b.done_tick = self.ticks
            b.event.set()
        else:
            self._fifo.append(b)
        return b

    def post(self, version: int) -> SimUpdate:
        """A weight update to ``version`` arrives (see the class docstring for when it lands)."""
        u = SimUpdate(version)
        self._fifo.append(u)
        return u

    @property
    def idle(self) -> bool:
        """Nothing running, waiting or loading."""
        return not (self.running or self._fifo or self._loading)

    def _next_update(self) -> SimUpdate | None:
        if self.in_flight:
            u = next((x for x in self._fifo if isinstance(x, SimUpdate)), None)
        else:
            u = self._fifo[0] if self._fifo and isinstance(self._fifo[0], SimUpdate) else None  # (the batch before it
            # leaves the queue when its last sample ends)
        if u is not None:
            self._fifo.remove(u)
        return u

    def _land(self, u: SimUpdate) -> None:
        self.version = u.version
        u.landed_tick = self.ticks
        self.updates.append((u.version, self.steps))

    def tick(self) -> tuple[list[SimBatch], list[SimUpdate]]:
        """One tick of the clock (see the class docstring). Returns the batches finished and the updates landed."""
        self.ticks += 1
        landed: list[SimUpdate] = []
        while self._loading is None and (u := self._next_update()) is not None:
            if self.load_ticks == 0:
                self._land(u)
                landed.append(u)
            else:
                self._loading = [u, self.load_ticks]
        if self._loading is not None:  # this tick loads weights: nothing decodes
            self.zero_ticks += not self.running
            self._loading[1] -= 1
            if self._loading[1] == 0:
                self._land(self._loading[0])
                landed.append(self._loading[0])
                self._loading = None
            return [], landed
        self._admit()
        if not self.running:
            self.zero_ticks += 1
            return [], landed
        self.steps += 1
        self.busy += len(self.running)
        done = []
        for s in self.running:
            s.versions.append(self.version)
            s.steps.append(self.steps)
            if len(s.versions) == s.length:
                done.append(s)
        self.running = [s for s in self.running if len(s.versions) < s.length]
        finished = []
        for s in done:
            s.batch.left -= 1
            if s.batch.left == 0:
                s.batch.done_tick = self.ticks
                finished.append(s.batch)
                self._fifo.remove(s.batch)
        return finished, landed

    def _admit(self) -> None:
        free = self.slots - len(self.running)
        for x in self._fifo:  # (in flight no update is queued here: each left at the tick's start)
            if free == 0 or isinstance(x, SimUpdate):
                break  # (lock-step: an update waiting holds back every later batch)
            while free and x.queued:
                self.running.append(x.queued.popleft())
                free -= 1
            if not self.in_flight:
                break  # lock-step: the head batch only


class SlotEngine(FakeEngine):
    """A fake engine shaped like a GPU vLLM with continuous batching: :class:`SlotSim` of ``slots`` C slots, ticked
    by a thread of its own every ``dt_s`` seconds of wall time (the clock ticks whether or not samples run, so
    idle time counts; a tick late on a busy CPU is not made up: the clock then runs slow, ``clock_rate`` says).

    ``generate(prompts, sampling)`` enqueues P x G samples, each ``short`` tokens long or, with probability
    ``long_frac``, ``short x long_mult`` (the long tail; the coin is seeded by the call's sampling seed, the
    prompt's index and the sample index, so every mode draws the same lengths for the same batch), capped at the
    prompt's token limit; it returns when the last one ends: G completions per prompt, ``text`` the gold for even
    sample indices (as :class:`FakeEngine`), ``finish_reason`` ``length`` at the cap, else ``stop``.
    ``receive_weights`` posts an update that loads for ``sync_s`` (in ticks, rounded) and returns once loaded.
    ``in_flight`` (the kwarg the run passes with ``rollout.in_flight_updates``) picks the mode of :class:`SlotSim`;
    in flight, each completion carries ``token_versions`` and ``policy_version`` = their minimum.

    ``marks[version]``: (ticks, busy slot-steps, zero ticks, wall s) when ``receive_weights(version)`` came;
    :meth:`usage` turns two marks into shares."""

    def __init__(self, model_dir: str, *, log: CallLog, role: str, slots: int, dt_s: float, short: int = 16,
                 long_mult: int = 8, long_frac: float = 0.1, sync_s: float = 0.0, in_flight: bool = False,
                 **kw: Any) -> None:
        super().__init__(model_dir, log=log, role=role, **kw)
        self.sim = SlotSim(slots, in_flight, load_ticks=round(sync_s / dt_s))
        self.dt_s, self.short, self.long_mult, self.long_frac = dt_s, short, long_mult, long_frac
        self.in_flight = in_flight
        self.batches: list[SimBatch] = []  # each generate call's, in call order
        self.marks: dict[int, tuple[int, int, int, float]] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._clock, daemon=True, name=f"{role}-clock")
        self._thread.start()

    def _clock(self) -> None:
        next_t = time.perf_counter()
        while True:
            next_t = max(next_t + self.dt_s, time.perf_counter())  # a late tick is not made up
            time.sleep(max(0.0, next_t - time.perf_counter()))
            with self._cond:
                if self._closed:
                    return
                finished, landed = self.sim.tick()
            for x in finished + landed:
                x.event.set()

    def _length(self, seed: int | None, prompt: Any, j: int, cap: int) -> int:
        coin = random.Random(f"{seed}-{prompt.index}-{j}").random()
        return min(cap, self.short * (self.long_mult if coin < self.long_frac else 1))

    def generate(self, prompts, sampling):
        self.log.add(self.role, "generate")
        caps = [p.max_new_tokens or sampling.max_new_tokens for p in prompts]
        lengths = [self._length(sampling.seed, p, j, cap) for p, cap in zip(prompts, caps) for j in range(sampling.n)]
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self.role}: the engine is shut down")
            b = self.sim.add(lengths)
            self.batches.append(b)
        b.event.wait()
        if b.done_tick is None:
            raise RuntimeError(f"{self.role}: the engine shut down with this batch running")
        out, k = [], 0
        for p, cap in zip(prompts, caps):
            for j in range(sampling.n):
                s = b.samples[k]
                k += 1
                out.append(Completion(prompt_index=p.index, sample_index=j, prompt_ids=list(p.prompt_ids),
                                      token_ids=[5] * s.length, logprobs=[-1.0] * s.length,
                                      text=p.gold if j % 2 == 0 else "wrong",
                                      finish_reason="length" if s.length >= cap else "stop",
                                      policy_version=min(s.versions),
                                      token_versions=list(s.versions) if self.in_flight else None))  # fmt: skip
        self.versions.append(min(c.policy_version for c in out) if out else self.sim.version)
        return out

    def receive_weights(self, specs, version, bucket_mb=0.0):
        self.log.add(self.role, "receive_weights")
        with self._cond:
            self.marks[version] = self._mark()
            u = self.sim.post(version)
        u.event.wait()
        if u.landed_tick is None:
            raise RuntimeError(f"{self.role}: the engine shut down before version {version} landed")
        self.version = version
        return 1.0

    def loop_usage(self) -> dict[str, float]:
        """As :meth:`rlvr.rollout.inflight.EngineLoop.usage`, on the simulated clock since the last call: ``step_s``
        the ticks with a sample in a slot, ``window_s`` all ticks, in units of ``dt_s`` (slot occupancy is
        :meth:`usage`'s)."""
        with self._cond:
            ticks, zero = self.sim.ticks, self.sim.zero_ticks
            t0, z0 = getattr(self, "_usage_mark", (0, 0))
            self._usage_mark = (ticks, zero)
        n = ticks - t0
        return {"window_s": n * self.dt_s, "step_s": (n - (zero - z0)) * self.dt_s, "load_s": 0.0, "job_s": 0.0}

    def _mark(self) -> tuple[int, int, int, float]:
        return self.sim.ticks, self.sim.busy, self.sim.zero_ticks, time.perf_counter() - self._t0

    def usage(self, v0: int, v1: int) -> dict[str, float]:
        """Between the arrivals of ``receive_weights`` v0 and v1: ``idle`` 1 - busy slot-steps / (C x ticks),
        ``zero`` the share of ticks with no sample in a slot, ``ticks``, ``clock_rate`` ticks per ``1 / dt_s``
        seconds of wall time (1: the clock kept time). Errors: ``KeyError`` for a version never received."""
        (t0, b0, z0, w0), (t1, b1, z1, w1) = self.marks[v0], self.marks[v1]
        ticks = max(1, t1 - t0)
        return {"idle": 1 - (b1 - b0) / (self.sim.slots * ticks), "zero": (z1 - z0) / ticks, "ticks": float(ticks),
                "clock_rate": ticks * self.dt_s / max(w1 - w0, 1e-9)}

    def shutdown(self) -> None:
        """Stop the clock; calls still waiting raise ``RuntimeError``."""
        with self._cond:
            self._closed = True
            waiting = [x for x in self.sim._fifo] + [s.batch for s in self.sim.running]
            if self.sim._loading is not None:
                waiting.append(self.sim._loading[0])
        for x in waiting:
            x.event.set()


class FakeScorer:
    def __init__(self, verifiers, *_: Any, log: CallLog, role: str, **__: Any) -> None:
        self.log, self.role, self.key = log, role, verifier_keys(verifiers)[0]
        self.verifiers = list(verifiers)

    def score(self, texts, golds, rows):
        self.log.add(self.role, "score")
        return [Scored(reward=float(t == g), results={self.key: VerifyResult(score=float(t == g))}, latency_s=0.0)
                for t, g in zip(texts, golds)]  # fmt: skip

    def close(self):
        return True

    def ping(self):
        return True


class FakeTrainer:
    def __init__(self, recipe, model_dir, rank, world_size, *_: Any, log: CallLog, role: str, delay_s: float = 0.0,
                 **__: Any) -> None:
        self.log, self.role, self.updates, self.delay_s, self.batches = log, role, [], delay_s, []

    def rendezvous_address(self):
        return "127.0.0.1", 0

    def setup(self, master_addr, master_port):
        self.log.add(self.role, "setup")
        return True

    def weight_specs(self):
        return SPECS

    def init_weight_sync(self, *args):
        return True

    def send_weights(self, bucket_mb=0.0, sample=True):
        self.log.add(self.role, "send_weights")
        return {"checksum": 1.0, "bytes": 4.0, "seconds": 0.0, "samples": {"w": torch.ones(1, 1)}}

    def train_step(self, batch, dph=None):
        self.log.add(self.role, "train_step")
        t0 = time.perf_counter()
        time.sleep(self.delay_s)
        self.updates.append(len(batch))
        self.batches.append(batch)
        return {"train/loss": 0.0, "train/skipped": 0.0, "train/optimizer_steps": 1.0, "train/grad_norm": 1.0,
                "timing/train_inner_s": time.perf_counter() - t0}

    def compute_logprobs(self, batch, reference=False, temperature=None):
        self.log.add(self.role, "compute_logprobs")
        return torch.full_like(batch.loss_mask, -1.0) * batch.loss_mask

    def probe_logprobs(self, prompt_ids, continuations):
        return [[-1.0] * (len(prompt_ids) - 1 + len(c)) for c in continuations]

    def save_state(self, out_dir, background=False):
        self.log.add(self.role, "save_state" + (" background" if background else ""))
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return out_dir

    def wait_saved(self):
        """The background writing takes ``delay_s`` (the executor's ``train_s``); when it ended: ``saved_at``."""
        time.sleep(self.delay_s)
        self.log.add(self.role, "wait_saved")
        self.saved_at = getattr(self, "saved_at", []) + [time.time()]
        return True

    def load_state(self, ckpt_dir):
        return 0

    def save_pretrained(self, out_dir):
        return out_dir

    def ping(self):
        return True


class FakeCritic(FakeTrainer):
    def __init__(self, recipe, model_dir, *_: Any, log: CallLog, role: str, **__: Any) -> None:
        self.log, self.role, self.updates = log, role, []

    def compute_values(self, batch):
        self.log.add(self.role, "compute_values")
        return torch.zeros_like(batch.loss_mask)

    def train_step(self, batch, old_values, returns):
        self.log.add(self.role, "critic_step")
        return {"critic/value_loss": 0.0}


class FakeJudge:
    def __init__(self, model_dir: str, *, log: CallLog, role: str, **_: Any) -> None:
        self.log, self.role, self.items = log, role, []

    def judge_with_text(self, items, settings):
        from rlvr.reward.judge import parse_verdict

        self.log.add(self.role, "judge_with_text")
        self.items.extend(items)
        return [parse_verdict("\\boxed{0}", settings.parse) for _ in items], ["\\boxed{0}"] * len(items)

    def ping(self):
        return True


class FakeTeacher:
    """The teacher of on-policy distillation: logprob -0.5 for every token after the first of each sequence."""

    def __init__(self, model_dir: str, *, log: CallLog, role: str, **_: Any) -> None:
        self.log, self.role, self.calls = log, role, []

    def score(self, sequences):
        self.log.add(self.role, "score")
        self.calls.append(sequences)
        return [[-0.5] * (len(s) - 1) for s in sequences]

    def ping(self):
        return True


class FakeExecutor(LocalExecutor):
    """The in-process executor, with each role's class swapped for its fake (by role name). ``generate_s`` /
    ``train_s``: how long the engine's ``generate`` and the trainer's ``train_step`` sleep (holding no CPU;
    ``generate_s`` may be a sequence of seconds, one per generate call, cycled);
    ``sync_s``: how long the engine's ``receive_weights`` sleeps; ``stale_call``: the engine generate call (0-based)
    that reports a policy version 100 versions old (every sample wrong); ``seeded``: which samples are right
    follows the call's sampling seed (a coin seeded by seed, prompt and sample index), so batches differ;
    ``slot_engine``: the engines are :class:`SlotEngine` built with these keyword arguments (``slots``, ``dt_s``,
    ...) and ``sync_s`` (``generate_s``, ``stale_call``, ``seeded`` are then unused)."""

    def __init__(self, all_right_calls: int = 0, generate_s: float | tuple[float, ...] = 0.0, train_s: float = 0.0,
                 stale_call: int = -1, sync_s: float = 0.0, seeded: bool = False,
                 slot_engine: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.log, self.all_right_calls = CallLog(), all_right_calls
        self.generate_s, self.train_s, self.stale_call, self.sync_s = generate_s, train_s, stale_call, sync_s
        self.seeded, self.slot_engine = seeded, slot_engine
        self.objects: dict[str, Any] = {}

    def spawn(self, name, cls, *args, resources=None, **kwargs):
        fake = (FakeEngine if name.startswith("engine") else FakeScorer if name == "reward"
                else FakeCritic if name == "critic" else FakeJudge if name == "judge"
                else FakeTeacher if name == "teacher" else FakeTrainer)  # fmt: skip
        kw = dict(kwargs, log=self.log, role=name)
        if fake is FakeEngine and self.slot_engine is not None:
            fake = SlotEngine
            kw.update(self.slot_engine, sync_s=self.sync_s)
        elif fake is FakeEngine:
            kw.update(all_right_calls=self.all_right_calls, delay_s=self.generate_s, stale_call=self.stale_call,
                      sync_s=self.sync_s, seeded=self.seeded)
        elif fake is FakeTrainer:
            kw["delay_s"] = self.train_s
        handle = super().spawn(name, fake, *args, resources=resources or Resources(), **kw)
        self.objects[name] = handle._target[1]  # the future of the role object
        return handle
