"""A served training model: rlvr's roles (trainer ranks, vLLM or HF engines, the checked weight sync) for one
``create_model``, and the sampling batcher that turns concurrent ``asample`` calls into batched engine calls.

Weights on the engines: the newest ones saved for the sampler. ``save_weights_for_sampler`` pushes the trainer's
weights through :meth:`rlvr.runtime.roles.Roles.sync` (checksums, read-back, the logprob probe: what ``rlvr train``
checks), so the engines serve exactly what the trainer holds at that point. A sampler path of older weights is
refused once newer ones are pushed (the engines hold one set of weights).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.serve.futures import Futures, Result, UserError
from rlvr.types import Prompt, SamplingConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleJob:
    """One ``asample`` call: its request id, prompt tokens [L], G = ``n`` samples, and whether to score the prompt."""

    rid: str
    prompt_ids: list[int]
    sampling: SamplingConfig
    prompt_logprobs: bool
    version: int
    prompt_logprobs_last_n: int | None = None


@dataclass
class ModelRun:
    """One training model (a Tinker ``model_id``): its roles, its base model name, LoRA rank (0: full fine-tuning),
    the policy version the trainer holds, the version the engines hold, its sampler checkpoints."""

    model_id: str
    session_id: str
    base_model: str
    lora_rank: int
    roles: Any
    state_dir: Path
    timeout_s: float
    targets: tuple[str, ...] = ()  # the LoRA target modules (() : the recipe's default)
    trainer_version: int = 0
    engine_version: int = 0
    samplers: dict[str, int] = field(default_factory=dict)  # sampling session id or sampler path -> version
    engine_lock: threading.Lock = field(default_factory=threading.Lock)

    # -- training (run on the model's lane, in order) -------------------------------------------------------------
    def call_trainers(self, method: str, *args: Any, what: str) -> Any:
        """``method`` on every trainer rank (they all take part), rank 0's answer, within ``timeout_s``. Errors: a
        ``ValueError`` the trainer raised (bad input: a datum, a loss) as :class:`UserError` with its message; any
        other failure as the executor's ``RoleError``."""
        from rlvr.runtime.executors import RoleError

        calls = [t.call(method, *args) for t in self.roles.trainers]
        try:
            return self.roles.get(calls, self.timeout_s, f"{what} (model {self.model_id})", None)[0]
        except RoleError as e:
            bad = user_cause(e)
            if bad is not None:
                raise UserError(str(bad)) from e
            raise

    def forward_backward(self, data, loss_fn: str, config, forward_only: bool) -> dict[str, Any]:
        return self.call_trainers("forward_backward", data, loss_fn, config, forward_only,
                                  what="forward" if forward_only else "forward_backward")

    def optim_step(self, adam: dict[str, float]) -> dict[str, float]:
        out = self.call_trainers("optim_step", adam["learning_rate"], adam["beta1"], adam["beta2"], adam["eps"],
                                 adam.get("weight_decay", 0.0), adam.get("grad_clip_norm", 0.0), what="optim_step")
        self.trainer_version += 1
        return out

    def push_to_engines(self) -> dict[str, float]:
        """The trainer's weights onto every engine (the checked sync), unless they already hold them."""
        if self.engine_version == self.trainer_version:
            return {}
        with self.engine_lock:
            stats = self.roles.sync(self.trainer_version)
            self.engine_version = self.trainer_version
        return stats

    def save_state(self, name: str) -> Path:
        """Weights and optimizer state under ``state_dir/<model_id>/weights/<name>``, with ``serve.json`` (base
        model, LoRA rank, version) so a later server can load it."""
        out = self.state_dir / self.model_id / "weights" / name
        self.call_trainers("save_state", str(out), what="save_weights")
        (out / "serve.json").write_text(json.dumps({"base_model": self.base_model, "lora_rank": self.lora_rank,
                                                    "targets": list(self.targets), "version": self.trainer_version}))
        return out

    def load_state(self, folder: Path, optimizer: bool) -> int:
        version = int(self.call_trainers("load_weights", str(folder), optimizer, what="load_weights"))
        self.trainer_version = version
        self.engine_version = -1  # the engines hold other weights now: the next sampler save pushes these
        return version

    # -- sampling --------------------------------------------------------------------------------------------------
    def generate(self, jobs: list[SampleJob]) -> list[tuple[list, list[float | None] | None]]:
        """One engine call per engine for ``jobs`` (same sampling settings): per job ([(tokens, logprobs, stop
        reason)] x G, prompt logprobs [L] or None). Errors: ``UserError`` when a job's weights are no longer on the
        engines."""
        with self.engine_lock:
            stale = [j for j in jobs if j.version != self.engine_version]
            if stale:
                raise StaleSampler(stale, self.engine_version)
            engines = self.roles.engines
            prompts = [Prompt(index=i, text="", prompt_ids=j.prompt_ids, gold="") for i, j in enumerate(jobs)]
            shards = [list(range(k, len(jobs), len(engines))) for k in range(len(engines))]
            calls = [(e, s) for e, s in zip(engines, shards) if s]
            got = self.roles.get([e.call("generate", [prompts[i] for i in s], jobs[0].sampling) for e, s in calls],
                                 self.timeout_s, f"sampling {len(jobs)} prompts (model {self.model_id})", None)
            out: list[list] = [[] for _ in jobs]
            for (_, s), comps in zip(calls, got):
                for c in comps:
                    out[c.prompt_index].append((c.token_ids, c.logprobs, c.finish_reason))
            scored = [j for j in jobs if j.prompt_logprobs]
            plp: dict[int, list[float | None]] = {}
            if scored:
                seqs = [j.prompt_ids for j in scored]
                lps = self.roles.get([engines[0].call("sequence_logprobs", seqs, 1.0)], self.timeout_s,
                                     f"prompt logprobs of {len(seqs)} prompts (model {self.model_id})", None)[0]
                for j, lp in zip(scored, lps):
                    full: list[float | None] = [None] + list(lp)
                    if j.prompt_logprobs_last_n is not None:  # only the last N scored, the rest None (the SDK's rule)
                        keep = len(full) - j.prompt_logprobs_last_n
                        full = [None] * keep + full[keep:]
                    plp[id(j)] = full
        return [(o, plp.get(id(j))) for o, j in zip(out, jobs)]


class StaleSampler(UserError):
    """Jobs whose sampler weights are no longer on the engines (:meth:`ModelRun.generate`)."""

    def __init__(self, jobs: list[SampleJob], now: int) -> None:
        self.jobs = jobs
        super().__init__(f"the sampler weights of policy version {jobs[0].version} were replaced on the engines by "
                         f"version {now} (rlvr serve keeps the newest sampler weights): save weights for the sampler "
                         "again and sample from the new client")


def user_cause(e: BaseException) -> BaseException | None:
    """The ``ValueError`` behind a role call's failure (the local executor chains it; Ray wraps it in a
    ``RayTaskError`` whose ``cause`` it is), or None: the caller's bad input rather than a server fault."""
    seen = 0
    c: BaseException | None = e.__cause__
    while c is not None and seen < 8:
        inner = getattr(c, "cause", None)
        if isinstance(inner, ValueError):
            return inner
        if isinstance(c, ValueError):
            return c
        c, seen = c.__cause__, seen + 1
    return None


class SampleBatcher:
    """Concurrent ``asample`` calls of one model, gathered into batched engine calls: a thread takes every job
    queued (up to ``max_batch`` jobs), groups them by sampling settings and runs each group as one
    :meth:`ModelRun.generate`; each job's result goes to its future (protobuf ``SampleResponse``). A batch gathers
    until no job has come for ``gap_s`` seconds, or ``window_s`` seconds after its first job."""

    def __init__(self, run: ModelRun, futures: Futures, max_batch: int = 256, gap_s: float = 0.05,
                 window_s: float = 0.5) -> None:
        self.run, self.futures, self.max_batch, self.gap_s, self.window_s = run, futures, max_batch, gap_s, window_s
        self.q: queue.Queue[SampleJob | None] = queue.Queue()
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name=f"serve-sample-{run.model_id}", daemon=True)
        self.thread.start()

    def put(self, job: SampleJob) -> None:
        """Queue ``job``. Errors: :class:`UserError` once the model is unloaded (its batcher closed)."""
        if self.closed:
            raise UserError(f"model {self.run.model_id} is unloaded: its sampling sessions have ended")
        self.q.put(job)

    def close(self) -> None:
        """Stop taking jobs; the queued ones fail with a message saying the model was unloaded."""
        self.closed = True
        self.q.put(None)

    def _run_group(self, group: list[SampleJob]) -> None:
        """One engine call for ``group`` (same sampling settings); each job's result or error goes to its future.
        Jobs whose sampler weights were replaced fail alone: the others are sampled."""
        from rlvr.serve.wire import encode_sample_response

        try:
            results = self.run.generate(group)
        except StaleSampler as e:
            self._fail(e.jobs, e)
            rest = [j for j in group if j not in e.jobs]
            if rest:
                self._run_group(rest)
            return
        except Exception as e:  # noqa: BLE001 - each caller is told; the server goes on
            self._fail(group, e)
            return
        for j, (seqs, plp) in zip(group, results):
            self.futures.finish(j.rid, Result(value=encode_sample_response(seqs, plp), proto=True))

    def _fail(self, jobs: list[SampleJob], e: BaseException) -> None:
        """Fail ``jobs`` with ``e``: category ``user`` for the caller's bad input (its message as it is), else
        ``server`` (logged)."""
        direct = isinstance(e, (UserError, ValueError))
        user = direct or user_cause(e) is not None
        if not user:
            log.error("sampling on model %s failed: %s: %s", self.run.model_id, type(e).__name__, e)
        msg = str(e) if direct else f"{type(e).__name__}: {e}"
        for j in jobs:
            self.futures.finish(j.rid, Result(error=msg, category="user" if user else "server"))

    def _drain(self) -> None:
        """Fail whatever is still queued after :meth:`close` (a client waiting on it is told, not left polling)."""
        while True:
            try:
                j = self.q.get_nowait()
            except queue.Empty:
                return
            if j is not None:
                self.futures.finish(j.rid, Result(error=f"model {self.run.model_id} was unloaded before this sample "
                                                        "ran", category="user"))

    def _loop(self) -> None:
        while True:
            first = self.q.get()
            if first is None:
                self._drain()
                return
            jobs = [first]
            # a burst of requests (a loop's group of asample calls) lands over tens of milliseconds: gather until
            # none comes for `gap_s`, at most `window_s` after the first, so that one engine call serves them all
            t_end = time.monotonic() + self.window_s
            while len(jobs) < self.max_batch:
                try:
                    nxt = self.q.get(timeout=max(0.0, min(self.gap_s, t_end - time.monotonic())))
                except queue.Empty:
                    break
                if nxt is None:
                    self.q.put(None)
                    break
                jobs.append(nxt)
            groups: dict[SamplingConfig, list[SampleJob]] = {}
            for j in jobs:
                groups.setdefault(j.sampling, []).append(j)
            for group in groups.values():
                self._run_group(group)
