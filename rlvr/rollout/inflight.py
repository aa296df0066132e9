"""In-flight weight updates: an engine loop that keeps its requests across a weight sync (``rollout.in_flight_updates``).

vLLM's synchronous engine has no pause; driving ``LLMEngine.step()`` yourself gives one (PipelineRL's way; vLLM's
``AsyncLLM.pause_generation(mode="keep")`` is the same on its async engine). :class:`EngineLoop` runs that loop in a
thread of its own, the only thread that touches the engine:

- requests come from any thread (:meth:`EngineLoop.submit`: a batch, answered when its last request finishes);
- everything else that touches the model (a weight load, prompt logprobs, the sync probe, a read-back) is a *job*
  run between two decode steps (:meth:`EngineLoop.call`); a weight load is :meth:`EngineLoop.update`;
- every token is labelled, as it comes out of a step, with the version of the weights that step ran with
  (``versions``), and keeps the logprob that step computed (the behaviour logprob). The version changes only in a
  job, between steps, in this thread: a label is never read after the fact (rllm #622), never applied to a token
  another version sampled (AReaL #1569), and a batch spanning an update says so token by token (labs-molt #124).
  An update aborts nothing (Miles #2589): the requests stay in the scheduler.

The KV cache of tokens computed before an update (``kv``): ``keep`` (PipelineRL: the running requests go on
attending to keys and values the old weights computed; the new weights apply from the next token) or
``recompute`` (NeMo-RL's ``recompute_kv_cache_after_weight_updates``: the running requests are preempted and their
whole prefix recomputed under the new weights before the next token; their tokens so far keep their labels and
logprobs). Either way no request submitted after an update reads a cached prefix the old weights computed: each
request's prefix cache is salted with the version it was submitted under (``cache_salt``).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger(__name__)

KV_MODES = ("keep", "recompute")


def require_lockstep_core(engine: Any) -> None:
    """Refuse a vLLM ``LLMEngine`` whose ``step()`` is not one decode step run in the calling thread.

    The loop's labels are exact only if nothing is sampled outside its own ``step()`` calls. With the engine core in
    a process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING=1``, vLLM's default on GPU) the core keeps stepping while
    the loop runs a job, and ``step()`` hands back tokens sampled steps ago; with async scheduling (a batch queue,
    vLLM's default on GPU) a batch is still running when ``step()`` returns. Either way a weight load between two
    ``step()`` calls would race a running batch and label old tokens with the new version (AReaL #1569).
    :class:`rlvr.rollout.vllm_engine.VLLMEngine` builds in-flight engines with the core in process and
    ``async_scheduling=False``. Objects that are not a vLLM engine (scripted cores in tests) pass.

    Errors: ``ValueError`` naming the setting to change."""
    client = getattr(engine, "engine_core", None)
    if client is None:
        return
    from vllm.v1.engine.core_client import InprocClient

    if not isinstance(client, InprocClient):
        raise ValueError(
            f"in-flight updates need vLLM's engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), not "
            f"{type(client).__name__}: a core in a process of its own samples tokens while a weight load runs")
    if getattr(client.engine_core, "batch_queue", None) is not None:
        raise ValueError("in-flight updates need vLLM's engine built with async_scheduling=False: with a batch "
                         "queue a batch still runs when step() returns, beside the weight load")


@dataclass
class Sampled:
    """One request's output: ``token_ids`` [T] sampled, ``logprobs`` [T] (nats, as the sampling step computed them),
    ``versions`` [T] the policy version of the weights each token was sampled with, ``text`` the detokenized
    output, ``finish_reason`` vLLM's (``stop``, ``length``, ``abort``), ``prompt_logprobs`` vLLM's prompt logprobs
    when asked (a list with None first), ``steps`` [T] the loop's decode-step count at each token (1-based)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "abort"
    prompt_logprobs: list | None = None


class _Batch:
    def __init__(self, n: int) -> None:
        self.future: cf.Future = cf.Future()
        self.outs: list[Sampled] = [Sampled() for _ in range(n)]
        self.left = n


class EngineLoopError(RuntimeError):
    """The engine failed inside its loop (a step or a job raised): every batch waiting on it gets this error."""


class EngineLoop:
    """The loop of one engine (see the module docstring).

    Args: ``core`` an object with vLLM ``LLMEngine``'s ``add_request(request_id, prompt, params, lora_request=...)``,
    ``step() -> list[RequestOutput]`` (outputs in ``RequestOutputKind.DELTA``: each step's new tokens) and
    ``reset_prefix_cache(reset_running_requests=...)``; ``version`` the policy version loaded; ``kv`` what an
    update does to the running requests' KV cache (:data:`KV_MODES`); ``step_lock`` held around each decode step and
    each job that runs the model (:data:`rlvr.rollout.vllm_engine.FORWARD_LOCK`: engines sharing a process);
    ``on_start`` run once in the loop's thread first (the OpenMP thread match of a CPU engine).
    Errors: ``ValueError`` for an unknown ``kv``.
    """

    def __init__(self, core: Any, version: int = 0, kv: str = "keep", step_lock: Any = None,
                 on_start: Callable[[], None] | None = None, name: str = "engine") -> None:
        if kv not in KV_MODES:
            raise ValueError(f"rollout.in_flight_kv={kv!r}: expected one of {KV_MODES}")
        self.core, self.version, self.kv = core, version, kv
        self.steps = 0
        """Decode steps taken (every ``core.step()`` with requests running)."""
        self.updates: list[tuple[int, int]] = []
        """(version, ``steps`` when it landed) of every update, oldest first."""
        self._step_lock = step_lock if step_lock is not None else nullcontext()
        self._on_start = on_start
        self._cond = threading.Condition()
        self._jobs: deque[tuple[Callable[[], Any], cf.Future, bool]] = deque()
        self._new: deque[tuple[_Batch, list[tuple[list[int], Any]], Any]] = deque()
        self._reqs: dict[str, tuple[_Batch, int]] = {}
        self._next = 0
        self._closed = False
        self._error: BaseException | None = None
        self._spent = {"step_s": 0.0, "load_s": 0.0, "job_s": 0.0}
        self._mark = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"rlvr-{name}-loop")
        self._thread.start()

    # -- what other threads call ---------------------------------------------------------------------------------
    def submit(self, requests: list[tuple[list[int], Any]], lora_request: Any = None) -> cf.Future:
        """Queue a batch of requests, each ``(prompt_ids, params)`` with ``params`` a ``SamplingParams`` of n = 1 in
        ``RequestOutputKind.DELTA``; returns a future of ``[Sampled]`` in request order, set when the last one ends.
        The requests join the running ones at the next step (continuous batching)."""
        batch = _Batch(len(requests))
        if not requests:
            batch.future.set_result([])
            return batch.future
        with self._cond:
            self._raise_if_broken()
            self._new.append((batch, list(requests), lora_request))
            self._cond.notify()
        return batch.future

    def call(self, fn: Callable[[], Any], forward: bool = True) -> cf.Future:
        """Run ``fn()`` in the loop's thread between two decode steps (with the step lock when ``forward``); returns
        its future."""
        fut: cf.Future = cf.Future()
        with self._cond:
            self._raise_if_broken()
            self._jobs.append((fn, fut, forward))
            self._cond.notify()
        return fut

    def update(self, load: Callable[[], Any], version: int) -> cf.Future:
        """A weight update as a job: ``load()`` (receives and loads the weights; without the step lock, as every
        engine of a process takes part in one broadcast), then the KV policy (``recompute``: every running request
        preempted, its prefix recomputed at its next step), then ``version`` stamped: tokens of later steps carry it.
        Returns the future of ``load()``'s result."""

        def job() -> Any:
            t0 = time.perf_counter()
            out = load()
            if self.kv == "recompute":
                with self._step_lock:
                    self.core.reset_prefix_cache(reset_running_requests=True)
            self.version = version
            self.updates.append((version, self.steps))
            self._spend("load_s", time.perf_counter() - t0)
            return out

        return self.call(job, forward=False)

    def usage(self) -> dict[str, float]:
        """Where the loop's time went since the last call (or its start), in seconds: ``window_s`` the wall time,
        ``step_s`` in decode steps (requests running), ``load_s`` in weight loads (:meth:`update`, the recompute
        included), ``job_s`` in other jobs; the rest it waited with nothing to do. Resets the counts."""
        with self._cond:
            now = time.perf_counter()
            out = {**self._spent, "window_s": now - self._mark}
            self._spent = dict.fromkeys(self._spent, 0.0)
            self._mark = now
        return out

    def _spend(self, key: str, seconds: float) -> None:
        with self._cond:
            self._spent[key] += seconds

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the loop (after the job or step in progress); waiting batches get :class:`EngineLoopError`."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=timeout_s)

    # -- the loop ------------------------------------------------------------------------------------------------
    def _raise_if_broken(self) -> None:
        if self._error is not None:
            raise EngineLoopError(f"the engine loop stopped on {type(self._error).__name__}: {self._error}")
        if self._closed:
            raise EngineLoopError("the engine loop is closed")

    def _run(self) -> None:
        try:
            if self._on_start is not None:
                self._on_start()
            while True:
                with self._cond:
                    while not (self._jobs or self._new or self._reqs or self._closed):
                        self._cond.wait()
                    if self._closed:
                        break
                    jobs, self._jobs = list(self._jobs), deque()
                    new, self._new = list(self._new), deque()
                for fn, fut, forward in jobs:  # between two steps: the weights change here, and only here
                    if fut.set_running_or_notify_cancel():
                        t0 = time.perf_counter()
                        try:
                            with self._step_lock if forward else nullcontext():
                                fut.set_result(fn())
                        except BaseException as e:  # noqa: BLE001 - handed to the caller
                            fut.set_exception(e)
                        if forward:  # (a weight load counts itself, as load_s)
                            self._spend("job_s", time.perf_counter() - t0)
                for batch, reqs, lora in new:
                    self._add(batch, reqs, lora)
                if self._reqs:
                    t0 = time.perf_counter()
                    with self._step_lock:
                        outs = self.core.step()
                    self._spend("step_s", time.perf_counter() - t0)
                    self.steps += 1
                    self._take(outs)
        except BaseException as e:  # noqa: BLE001 - a failed step fails every waiting batch, never silently
            log.error("engine loop failed: %s: %s", type(e).__name__, e)
            self._error = e
        self._fail_all(self._error)

    def _add(self, batch: _Batch, reqs: list[tuple[list[int], Any]], lora: Any) -> None:
        for k, (ids, params) in enumerate(reqs):
            rid = f"rlvr-{self._next}"
            self._next += 1
            prompt = {"prompt_token_ids": list(ids), "cache_salt": f"rlvr-v{self.version}"}
            got = self.core.add_request(rid, prompt, params, lora_request=lora)
            with self._cond:
                self._reqs[rid] = (batch, k)
                if isinstance(got, str) and got != rid:
                    self._reqs[got] = (batch, k)

    def _take(self, outs: list[Any]) -> None:
        """Append each output's new tokens with the version this step ran with; answer finished batches."""
        for out in outs:
            with self._cond:
                slot = self._reqs.get(out.request_id)
            if slot is None:
                continue
            batch, k = slot
            s = batch.outs[k]
            if getattr(out, "prompt_logprobs", None) is not None and s.prompt_logprobs is None:
                s.prompt_logprobs = list(out.prompt_logprobs)
            o = out.outputs[0]
            ids = list(o.token_ids)
            s.token_ids += ids
            lps = [float(step[t].logprob) for t, step in zip(ids, o.logprobs)] if o.logprobs else [0.0] * len(ids)
            s.logprobs += lps
            s.versions += [self.version] * len(ids)
            s.steps += [self.steps] * len(ids)
            s.text += o.text or ""
            if out.finished:
                s.finish_reason = str(o.finish_reason) if o.finish_reason is not None else "abort"
                with self._cond:
                    for key in [key for key, v in self._reqs.items() if v == slot]:
                        del self._reqs[key]
                batch.left -= 1
                if batch.left == 0:
                    batch.future.set_result(batch.outs)

    def _fail_all(self, error: BaseException | None) -> None:
        err = EngineLoopError(f"the engine loop stopped on {type(error).__name__}: {error}" if error else
                              "the engine loop was closed with requests waiting")
        with self._cond:
            batches = {id(b): b for b, _ in self._reqs.values()}
            batches.update({id(b): b for b, _, _ in self._new})
            jobs = list(self._jobs)
            self._reqs.clear()
            self._new.clear()
            self._jobs.clear()
        for b in batches.values():
            if not b.future.done():
                b.future.set_exception(err)
        for _, fut, _ in jobs:
            if not fut.done():
                fut.set_exception(err)
