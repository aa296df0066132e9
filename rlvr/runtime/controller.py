"""The controller: sets up the roles and runs the training step loop (prompts -> rollout -> reward -> train -> sync).

The loop reads top to bottom in :func:`train`; the roles are plain classes run by an executor
(:mod:`rlvr.runtime.executors`). Metrics are namespaced (``reward/mean``, ``passk/8``, ``timing/rollout_s``,
``sync/gbps``; every name built by :mod:`rlvr.metrics.names`) and logged in one place, to ``RUN/metrics.jsonl``
and the console.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlvr.algos.dapo import overlong_mask
from rlvr.config import Recipe
from rlvr.metrics import names as mn
from rlvr.metrics.progress import Progress
from rlvr.metrics.samples import log_first_prompt, print_sample_table
from rlvr.metrics.timeline import append_step, role_usage, staleness_metrics
from rlvr.metrics.sinks import make_sinks
from rlvr.runtime.advantage_stage import (build_dph_buffer, dph_batch, form_advantages, needs_reference, uses_critic,
                                          uses_teacher)
from rlvr.runtime.checks import preflight  # noqa: F401 (rlvr.runtime.controller.preflight: checks at load)
from rlvr.runtime.roles import Roles
from rlvr.runtime.rundir import prepare_run_dir, resume_point, write_recipe  # noqa: F401 (cli, tests)
from rlvr.runtime.rollout_stage import Rollout, RolloutStage, infra_valid, rule_scores, step_sampling
from rlvr.runtime.validation import run_validation, validation_prompts
from rlvr.seeding import DPH_BUFFER_ROUND, set_rng_state
from rlvr.train.batch import TrainBatch, pack
from rlvr.types import Prompt, SamplingConfig

log = logging.getLogger("rlvr")


@dataclass(frozen=True)
class RunResult:
    run_dir: str
    final_dir: str | None
    steps: int
    last_metrics: dict[str, float]


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run after a step; a checkpoint of that step was written first."""

    def __init__(self, signame: str, step: int, checkpoint: str | None):
        super().__init__(f"{signame} after step {step}; checkpoint: {checkpoint}")
        self.signame, self.step, self.checkpoint = signame, step, checkpoint


class NonFiniteError(RuntimeError):
    """``trainer.max_nonfinite_in_row`` updates in a row had a NaN/inf loss or gradient (each was skipped)."""


class _StopFlag:
    """SIGINT/SIGTERM handler: the first signal asks the loop to stop after the current step (and checkpoint);
    a second one aborts at once (KeyboardInterrupt). Installed only in the main thread; restored on exit."""

    def __init__(self) -> None:
        self.signame: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_StopFlag":
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        import signal

        if self.signame is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: aborting without a checkpoint")
        self.signame = signal.Signals(signum).name
        log.warning("%s received: stopping after this step and writing a checkpoint (again to abort at once)", self.signame)

    def __exit__(self, *exc: object) -> None:
        import signal

        for sig, old in self._old.items():
            signal.signal(sig, old)


class Checkpointing:
    """A checkpoint being written (:func:`save_checkpoint`); :meth:`finish` commits it once every role's files are
    written (at once for a checkpoint written in the roles' calls) and returns its path."""

    def __init__(self, roles: "Roles", run_dir: Path, step: int, tmp: Path, waits: list, r: Recipe, t_call: float,
                 t_roles: float) -> None:
        self.roles, self.run_dir, self.step, self.tmp, self.waits, self.r = roles, run_dir, step, tmp, waits, r
        self.t_call, self.t_roles = t_call, t_roles  # seconds in save_checkpoint, of which the roles' calls
        self.path: str | None = None

    def finish(self) -> str:
        """Wait for the roles' writing (``timeouts.checkpoint_s``), commit and prune; returns the checkpoint's path.
        Errors: :class:`RoleError` when a role's writing failed or overran (the folder is abandoned)."""
        from rlvr.runtime import checkpoint as ck

        if self.path is not None:
            return self.path
        try:
            t1 = time.perf_counter()
            if self.waits:
                self.roles.get(self.waits, self.r.timeouts.checkpoint_s, f"writing the checkpoint of step {self.step}",
                               "timeouts.checkpoint_s")  # fmt: skip
            t2 = time.perf_counter()
            final = ck.commit(self.tmp)
            t_wait, t_commit = t2 - t1, time.perf_counter() - t2
        except BaseException:
            self.abandon()
            raise
        c = self.r.checkpoint
        ck.prune(self.run_dir, c.keep_last, c.best_metric, c.best_mode)
        size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
        log.info("checkpoint %s written (%.2f GB); the run waited %.1fs for it (the roles' part %.1fs, fsync and "
                 "rename %.1fs)%s", final, size / 1e9, self.t_call + t_wait + t_commit, self.t_roles + t_wait,
                 t_commit, "; the files written in the background" if self.waits else "")  # fmt: skip
        self.path = str(final)
        return self.path

    def abandon(self) -> None:
        """Drop the folder of a checkpoint that will not be finished."""
        from rlvr.runtime import checkpoint as ck

        if self.path is None:
            ck.abandon(self.tmp)


def save_checkpoint(roles: "Roles", run_dir: Path, step: int, sampler: Any, r: Recipe, data_fp: dict, metrics: dict,
                    ahead: dict | None = None, background: bool = False) -> Checkpointing:
    """Write ``RUN/checkpoints/step_N`` (:mod:`rlvr.runtime.checkpoint`: temporary folder, every trainer rank's
    state, the critic's, the controller's, then an atomic rename) and prune old ones: :meth:`Checkpointing.finish`
    returns its path. ``ahead``: under asynchronous rollout, the batches generated for the next steps
    (``checkpoint.AHEAD``, :meth:`~rlvr.runtime.rollout_stage.RolloutStage.ahead_state`): their weights are gone
    once the trainer moves on, so a resumed run reads them back instead of regenerating. ``background``
    (``checkpoint.async_write``): the trainer ranks snapshot their state and write it on a thread
    (:mod:`rlvr.train.ckpt_write`); the checkpoint is committed when :meth:`Checkpointing.finish` is called and
    their writing has ended (the ranks run their next calls after it)."""
    from rlvr.runtime import checkpoint as ck

    t0 = time.perf_counter()
    tmp = ck.begin(run_dir, step)
    try:
        calls = [t.call("save_state", str(tmp / ck.TRAINER), background) for t in roles.trainers]
        if roles.critic is not None:
            calls.append(roles.critic.call("save_state", str(tmp / ck.CRITIC)))
        roles.get(calls, r.timeouts.checkpoint_s, f"writing the checkpoint of step {step}", "timeouts.checkpoint_s")
        t_roles = time.perf_counter() - t0
        ck.save_controller(tmp, step=step, policy_version=step, sampler_state=sampler.state_dict(), recipe=r,
                           data_fp=data_fp, metrics=metrics)
        if ahead:
            torch.save(ahead, tmp / ck.AHEAD)
    except BaseException:
        ck.abandon(tmp)
        raise
    waits = [t.call("wait_saved") for t in roles.trainers] if background else []
    return Checkpointing(roles, run_dir, step, tmp, waits, r, time.perf_counter() - t0, t_roles)


def _restore(roles: "Roles", ckpt: Path, state: Any) -> None:
    """Load every trainer rank's and the critic's state from ``ckpt``, then push the weights to the engines."""
    from rlvr.runtime import checkpoint as ck

    calls = [t.call("load_state", str(ckpt / ck.TRAINER)) for t in roles.trainers]
    if roles.critic is not None:
        calls.append(roles.critic.call("load_state", str(ckpt / ck.CRITIC)))
    roles.get(calls, roles.recipe.timeouts.checkpoint_s, f"loading checkpoint {ckpt}", "timeouts.checkpoint_s")
    roles.sync(version=state.policy_version)


@dataclass
class _Data:
    """What the run trains on: the tokenizer's pad id, the prompts and their fingerprint (checked on resume)."""

    model_dir: str
    tokenizer: Any
    prompts: list[Prompt]
    fingerprint: dict
    pad_id: int


def _load_data(r: Recipe) -> _Data:
    """Model folder, tokenizer, prompts (:func:`rlvr.runtime.checks.load_prompts`: rows, golds checked, the
    model's context) and every verifier built; errors name the recipe key to change."""
    from transformers import AutoTokenizer

    from rlvr.models import model_context
    from rlvr.runtime import checkpoint as ck
    from rlvr.runtime.checks import build_verifiers, check_chat_template, load_prompts

    model_dir, ctx = model_context(r.model.path)
    tok = AutoTokenizer.from_pretrained(model_dir)
    check_chat_template(r, tok)  # a multi-turn template the turns would refuse stops the run here, before any role
    prompts, _ = load_prompts(r, tok, ctx)
    build_verifiers(r)
    if r.teacher.model is not None:  # the teacher scores the student's token ids: one tokenizer (also in preflight)
        from rlvr.runtime.checks import check_teacher_tokenizer

        log.info(check_teacher_tokenizer(r.model.path, r.teacher.model))
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return _Data(model_dir, tok, prompts, ck.data_fingerprint(prompts), pad_id)


def _count_nonfinite(in_row: int, metrics: dict[str, float], step: int, r: Recipe) -> int:
    """Consecutive steps whose every update was skipped (NaN/inf); warns, and raises :class:`NonFiniteError` at
    ``trainer.max_nonfinite_in_row``."""
    all_skipped = metrics.get(mn.TRAIN_SKIPPED, 0.0) >= metrics.get(mn.TRAIN_OPTIMIZER_STEPS, 1.0)
    in_row = in_row + 1 if all_skipped else 0
    if in_row:
        log.warning("step %d: NaN/inf loss or gradient, update skipped (%d in a row)", step, in_row)
    if in_row >= r.trainer.max_nonfinite_in_row:
        raise NonFiniteError(
            f"{in_row} updates in a row had a NaN/inf loss or gradient (steps {step - in_row + 1}-{step}; "
            f"trainer.max_nonfinite_in_row={r.trainer.max_nonfinite_in_row}): "
            "lower trainer.lr, check the rewards, or resume from the last checkpoint"
        )
    return in_row


@dataclass
class Standing:
    """Roles that outlive a failed attempt of a run, for the next one (:mod:`rlvr.runtime.restarts`): when a trainer
    rank (or the critic) died, :func:`train` leaves the other roles running here instead of stopping them, and the
    next attempt rebuilds the trainer group (:meth:`~rlvr.runtime.roles.Roles.rebuild_trainers`) and goes on from
    the newest checkpoint with the engines it had (:func:`keeps_roles` says when)."""

    roles: Roles | None = None


def keeps_roles(e: BaseException, r: Recipe) -> bool:
    """Whether the failure ``e`` leaves roles worth keeping for a restart: a trainer rank's or the critic's process
    died (the engines, reward worker, judge and teacher hold no training state), under the Ray executor, and the
    engines hold nothing of the failed attempt that a rollback would contradict (not with in-flight weight updates,
    whose engines keep the attempt's requests running, nor with adapter sync, whose engines hold the attempt's
    adapter versions)."""
    from rlvr.runtime.executors import RoleError

    cause = e if isinstance(e, RoleError) else e.__cause__
    return (isinstance(cause, RoleError) and cause.died and cause.role is not None
            and (cause.role.startswith("trainer") or cause.role == "critic") and r.run.executor == "ray"
            and not r.rollout.in_flight_updates and not r.trainer.lora.adapter_sync)  # fmt: skip


def train(recipe: Recipe, run_dir: Path | None = None, executor: Any | None = None,
          standing: Standing | None = None) -> RunResult:
    """Run a recipe end to end; returns where the run folder and the final policy are.

    Each step (:func:`_one_step`): prompts -> rollout -> reward -> advantages -> update -> sync; then the sample
    table, validation, metrics, the NaN guard and the checkpoint. With ``run.resume`` (``auto`` or a checkpoint
    path) the run continues from a checkpoint: same prompts in the same order, same rollouts (seeded per step),
    same weights as an uninterrupted run.

    Errors: :class:`~rlvr.config.RecipeError` for bad data or config found while preparing, or a checkpoint whose
    recipe/data differ; :class:`~rlvr.sync.weights.WeightSyncError` when a weight sync fails or times out;
    :class:`~rlvr.runtime.executors.RoleError` when a role fails; :class:`NonFiniteError` after too many NaN
    updates in a row; :class:`RunInterrupted` after Ctrl-C/SIGTERM (a checkpoint was written). The run folder is
    marked ``RUNNING`` meanwhile and ``FAILED`` (the error, the step reached, what next) when it raises anything
    but :class:`RunInterrupted` (:func:`rlvr.runtime.rundir.marked`).

    ``standing``: roles kept from a failed attempt of this run (:class:`Standing`); they are used (their trainer
    group rebuilt) instead of starting new ones, and when this attempt fails from a cause :func:`keeps_roles`
    names, its roles are left there, running.
    """
    from rlvr.runtime.rundir import marked, run_log

    run_dir = run_dir or prepare_run_dir(recipe)
    with run_log(run_dir), marked(run_dir, clean=(RunInterrupted,)):
        return _train(recipe, run_dir, executor, standing)


def _train(recipe: Recipe, run_dir: Path, executor: Any | None, standing: Standing | None = None) -> RunResult:
    """:func:`train` in its marked run folder."""
    from rlvr.data import PromptSampler
    from rlvr.reward.pool import verifier_keys
    from rlvr.runtime import checkpoint as ck

    r = recipe
    log.info("run folder: %s", run_dir, extra={"console": False})  # rlvr train prints it (with what it holds)
    data = _load_data(r)
    log_first_prompt(data.prompts[0], data.tokenizer)  # the template, system text and tools listing, once
    resume_from, state = resume_point(r, run_dir, data.fingerprint)
    sampler = PromptSampler(len(data.prompts), r.rollout.prompts_per_step, r.run.seed, r.data.shuffle)
    if state is not None:
        sampler.load_state_dict(state.sampler)
    sampling = SamplingConfig(n=r.rollout.samples_per_prompt, max_new_tokens=r.rollout.max_new_tokens,
                              temperature=r.rollout.temperature, top_p=r.rollout.top_p, top_k=r.rollout.top_k)  # fmt: skip
    sink = make_sinks(r, run_dir)  # RUN/metrics.jsonl + metrics.backends (TensorBoard, W&B, MLflow)
    first = state.step + 1 if state is not None else 1
    progress = Progress(r.run.steps, enabled=r.metrics.progress, start_step=first - 1)
    t_start = time.perf_counter()
    metrics: dict[str, float] = {}
    final_dir = None
    saved_step = state.step if state is not None else 0
    roles: Roles | None = None
    kept = standing is not None and standing.roles is not None
    pending: Checkpointing | None = None  # a checkpoint the trainer ranks still write (checkpoint.async_write)
    try:  # from here on every path closes the sinks and stops the roles (Roles stops its own on a failed start)
        if kept:  # a trainer rank died in the last attempt: the other roles live on, the trainer group is new
            roles, standing.roles = standing.roles, None
            roles.rebuild_trainers()
        else:
            roles = Roles(r, data.model_dir, run_dir, executor)
        log.info("roles up in %.1fs (sync over %s, %.3f GB per sync)", time.perf_counter() - t_start, roles.sync_backend, roles.sync_bytes / 1e9)
        progress.watch(getattr(roles.ex, "waits", None))  # a heartbeat line on a non-terminal console
        primary = verifier_keys(r.reward.verifiers)[0]
        val_every, every_s, every_ck = r.validation.every_steps, r.metrics.samples_every, r.checkpoint.every_steps
        val_prompts = validation_prompts(r, data.tokenizer) if val_every else []
        if state is not None:
            _restore(roles, resume_from, state)
            set_rng_state(state.rng)
        elif kept:  # no checkpoint yet: the kept engines hold a later policy than the new trainer's starting one
            roles.sync(version=0)
        dph_buffer = _dph_buffer(roles, data.prompts, sampling, r, primary, run_dir)
        validate = functools.partial(rule_scores, roles)  # generate and score without the judge
        if val_every and r.validation.at_start and state is None:
            sink.log(0, {**run_validation(validate, val_prompts, r, primary, step=0,
                                          record=run_dir / "validation.jsonl"), mn.POLICY_VERSION: 0.0})
        nonfinite_in_row = 0
        rows_of = lambda s: r.metrics.samples_rows if every_s and s % every_s == 0 else 0  # noqa: E731
        stage = RolloutStage(roles, data.prompts, sampler, sampling, r, primary, rows_of)
        stage.fill(first, resume_from)  # the batches generated ahead (asynchronous rollout)
        origin = time.time()
        progress.start_clock()  # the ETA's pace: steps only, not the start-up
        with _StopFlag() as stop:
            for step in range(first, r.run.steps + 1):
                roles.step = step
                w0 = time.time()
                saves = bool(stop.signame or (every_ck and step % every_ck == 0) or step == r.run.steps)
                metrics, rows = _one_step(step, roles, stage, r, data.pad_id, dph_buffer, saves,
                                          pending.finish if pending is not None else None)
                pending = None
                metrics.update(_role_usage(roles, run_dir, step, w0, time.time(), origin))
                if rows:  # the table before the step's metrics (W&B steps must not go backwards)
                    sink.log_table(step, rows)
                    print_sample_table(step, rows)
                if val_every and (step % val_every == 0 or step == r.run.steps):
                    metrics.update(run_validation(validate, val_prompts, r, primary, step=step,
                                                  record=run_dir / "validation.jsonl"))
                sink.log(step, metrics)
                progress.update(step, metrics)
                nonfinite_in_row = _count_nonfinite(nonfinite_in_row, metrics, step, r)
                if stop.signame or (every_ck and step % every_ck == 0) or step == r.run.steps:
                    last = bool(stop.signame) or step == r.run.steps  # written now: the run ends after it
                    writing = save_checkpoint(roles, run_dir, step, sampler, r, data.fingerprint, metrics,
                                              stage.ahead_state(), r.checkpoint.async_write and not last)
                    saved_step = step
                    if last:
                        path = writing.finish()
                        if stop.signame and step < r.run.steps:
                            raise RunInterrupted(stop.signame, step, path)
                    else:  # committed by the next step, once its rollout is in (the ranks write meanwhile)
                        pending = writing
        if r.run.save_final:
            final_dir = str(run_dir / "final")
            roles.get([t.call("save_pretrained", final_dir) for t in roles.trainers], r.timeouts.checkpoint_s,
                      "saving the final policy", "timeouts.checkpoint_s")
            log.info("final policy saved to %s", final_dir)
    except BaseException as e:
        if pending is not None:  # the last step's checkpoint, still being written when this step failed
            _settle_on_failure(pending, e)
        if standing is not None and roles is not None and keeps_roles(e, r):
            standing.roles, roles = roles, None  # left running for the next attempt (rlvr.runtime.restarts)
        raise
    finally:
        progress.close()
        sink.close()
        if roles is not None:
            roles.shutdown()
    log.info("last checkpoint: step %d", saved_step)
    return RunResult(str(run_dir), final_dir, r.run.steps, metrics)


def _settle_on_failure(pending: Checkpointing, e: BaseException) -> None:
    """Commit a checkpoint still being written when the run failed with ``e`` if its writing ends well (the trainer
    ranks live: the restart then loses only the failed step), else drop it; never after Ctrl-C/SIGTERM's second
    signal (``KeyboardInterrupt``: it aborts at once) and never raising over ``e``."""
    if isinstance(e, Exception):
        try:
            log.info("the run failed while the checkpoint of step %d was written: committing it if it ends well",
                     pending.step)
            pending.finish()
            return
        except Exception as e2:  # noqa: BLE001 - the run's own failure is the one to raise
            log.warning("the checkpoint of step %d was not completed (%s: %s): dropped", pending.step,
                        type(e2).__name__, e2)
    pending.abandon()


def _role_usage(roles: "Roles", run_dir: Path, step: int, t0: float, t1: float, origin: float) -> dict[str, float]:
    """The step's ``roles/*`` metrics (:func:`rlvr.metrics.timeline.role_usage`) from the executor's call spans,
    and its row of ``RUN/timeline.jsonl``; nothing for an executor without a timeline."""
    timeline = getattr(roles.ex, "timeline", None)
    if timeline is None:
        return {}
    spans = timeline.since(t0)
    append_step(run_dir, step, t0, t1, spans, origin)
    timeline.trim(t1)
    return role_usage(spans, t0, t1)


def _dph_buffer(roles: "Roles", prompts: list[Prompt], sampling: SamplingConfig, r: Recipe, primary: str, run_dir: Path) -> list:
    """The DPH-RL buffer: built once from the starting policy and kept in ``RUN/dph_buffer.pt`` (a resumed run
    reads it back; its engines no longer hold the starting policy)."""
    al = r.algorithm
    if al.dph_divergence == "none" or al.dph_coef == 0:
        return []
    path = run_dir / "dph_buffer.pt"
    if path.exists():
        return torch.load(path, weights_only=False)
    buf = build_dph_buffer(functools.partial(rule_scores, roles), prompts,
                           step_sampling(sampling, r.run.seed, 0, DPH_BUFFER_ROUND), r, primary)
    if not buf:
        log.warning("DPH-RL: the starting policy solved none of its %d buffer prompts; the DPH term is off "
                    "(raise algorithm.dph_prompts or use easier data)", al.dph_prompts)
    torch.save(buf, path)
    return buf


def _one_step(step: int, roles: "Roles", stage: RolloutStage, r: Recipe, pad_id: int, dph_buffer: list,
              saves: bool = False, settle: Any = None) -> tuple[dict[str, float], list[dict]]:
    """One training step, the five steps of the design guide: prompts -> rollouts scored by the verifiers ->
    advantages -> policy (and critic) update -> weight sync, then the step's metrics. Returns the metrics and the
    rows of the step's sample table (``stage.rows_of(step)`` of them, :func:`rlvr.metrics.samples.sample_rows`).

    With ``rollout.max_staleness`` = N >= 1 (asynchronous rollout) the engines generate step s + N's batch while
    the trainer updates on step s's, generated N steps ago (the stage's ``ahead``, by step). Order: submit
    generation of s + N (the engines hold the weights of version s - 1) -> take batch s -> advantages -> submit the
    update -> collect and score s + N while it runs -> wait for the update -> sync version s (the engines are idle
    by then: each engine runs its calls in order, so they take the new weights between batches, and no sample
    mixes two versions). So batch s was generated by version max(0, s - 1 - N) and is N versions behind the
    weights it updates (fewer for the first N steps). At N = 0 the batch is generated and collected first:
    generation and training take turns. Either way samples older than N versions are dropped and regenerated
    (:meth:`~rlvr.runtime.rollout_stage.RolloutStage.drop_stale`). With ``rollout.in_flight_updates`` the engines
    keep s + 1 .. s + N in flight across the sync (no collection beside the update; each batch is collected when
    its step takes it), except at a step that ``saves`` a checkpoint: there they finish before the sync
    (:meth:`~rlvr.runtime.rollout_stage.RolloutStage.drain`). ``settle``: called once the batch is taken (commits
    the previous step's checkpoint written in the background, :class:`Checkpointing`)."""
    t_step = time.perf_counter()
    roll, dropped = stage.take(step)  # 1-2: submit s + N; the batch of s (generated and scored now at N = 0)
    if settle is not None:  # the last step's checkpoint, written by the ranks during this rollout: committed now
        settle()
    batch, critic_inputs, adv_metrics = _advantage_batch(roll, roles, r, pad_id)  # 3a: advantages
    calls = _submit_update(roles, batch, critic_inputs, dph_batch(dph_buffer, step, r, pad_id), step)  # 3b: update
    stage.collect_ahead(step)  # 1-2 for step s + N, beside the update
    t0 = time.perf_counter()  # the controller has nothing left to do but wait for the update
    train_stats = _wait_update(roles, calls, critic_inputs is not None, r)
    t1 = time.perf_counter()
    if saves and stage.in_flight:  # the checkpoint must not depend on where the update lands: drain first
        stage.drain()
    sync_stats = {**roles.sync(version=step), **stage.engine_usage()}  # 4: push the new weights to every engine
    return (_step_metrics(step, roll, adv_metrics, train_stats, sync_stats, dropped, stage.sampler, r, t_step, t0, t1),
            roll.rows)


def _step_metrics(step: int, roll: Rollout, adv_metrics: dict, train_stats: dict, sync_stats: dict, dropped: int,
                  sampler: Any, r: Recipe, t_step: float, t0: float, t1: float) -> dict[str, float]:
    """Step 5 of :func:`_one_step`: the step's metrics (logged by the caller). Every ``timing/*`` means the same
    in both loops (:mod:`rlvr.metrics.names`): the rollout stages are those of the batch trained (generated this
    step, or N steps ago under asynchronous rollout), ``timing/train_s`` the update inside the trainer
    (``train_stats``), ``timing/train_wait_s`` the controller's wait for it.
    ``t_step``, ``t0``, ``t1``: ``time.perf_counter()`` at the step's start, when the controller began to wait for
    the update (after the overlapped rollout, if any), the update's end."""
    step_s = time.perf_counter() - t_step
    teacher = {mn.TIMING_TEACHER_SHARE: adv_metrics[mn.TIMING_TEACHER_S] / max(step_s, 1e-9)} \
        if mn.TIMING_TEACHER_S in adv_metrics else {}  # fmt: skip
    return {
        **staleness_metrics(roll.completions, step - 1, r.rollout.max_staleness),
        mn.ASYNC_DROPPED_STALE: float(dropped),
        **roll.metrics,
        **adv_metrics,
        **train_stats,
        **sync_stats,
        **roll.timings,
        mn.TIMING_TRAIN_WAIT_S: t1 - t0,
        mn.TIMING_SYNC_S: time.perf_counter() - t1,
        mn.TIMING_STEP_S: step_s,
        **teacher,
        mn.ROLLOUT_TOKENS_PER_S: sum(c.sampled_tokens for c in roll.completions)
        / max(roll.timings[mn.TIMING_ROLLOUT_S], 1e-9),
        mn.DATA_EPOCH: float(sampler.epoch),
        mn.POLICY_VERSION: float(step),
    }


def _advantage_batch(roll: Rollout, roles: "Roles", r: Recipe, pad_id: int) -> tuple[TrainBatch, dict | None, dict[str, float]]:
    """The batch the trainer updates on: packed, DAPO's overlong filter applied, the reference's logprobs and the
    critic's values and the teacher's logprobs (``timing/teacher_s``) computed where the recipe needs them, and
    advantages formed (:func:`form_advantages`).
    Returns (batch, critic inputs or None, metrics)."""
    batch = pack(roll.completions, torch.zeros(len(roll.completions)), pad_id, r.rollout.max_new_tokens)
    metrics: dict[str, float] = {}
    if r.algorithm.overlong_filter:  # DAPO: truncated samples carry no loss (and leave the token normaliser)
        keep = overlong_mask(torch.tensor([c.truncated for c in roll.completions]))  # [B]
        batch = dataclasses.replace(batch, loss_mask=batch.loss_mask * keep.unsqueeze(-1))
        metrics[mn.RESPONSE_FILTERED_FRAC] = float(1.0 - keep.mean())
    ref_lp = roles.reference_logprobs(batch) if needs_reference(r) else None
    values = roles.critic_values(batch) if uses_critic(r) else None
    teacher_lp = None
    if uses_teacher(r):  # on-policy distillation: the teacher scores every token of the batch, one call
        t0 = time.perf_counter()
        teacher_lp = roles.teacher_logprobs(batch)
        metrics[mn.TIMING_TEACHER_S] = time.perf_counter() - t0
    batch, critic_inputs, adv_metrics = form_advantages(batch, roll.rewards, r, ref_logprobs=ref_lp, values=values,
                                                        teacher_logprobs=teacher_lp,
                                                        valid=infra_valid(roll.completions, roll.rewards.shape[1]))  # fmt: skip
    return batch, critic_inputs, {**metrics, **adv_metrics}


def _submit_update(roles: "Roles", batch: TrainBatch, critic_inputs: dict | None, dph: TrainBatch | None,
                   version: int) -> list:
    """Submit the policy update on every trainer rank (with the DPH-RL batch, if any) and, beside it, the critic's;
    returns the calls. Once they have run the trainer holds policy version ``version`` (``Roles.trainer_version``:
    an engine replaced meanwhile is given those weights)."""
    calls = [t.call("train_step", batch, dph) for t in roles.trainers]
    if critic_inputs is not None:  # the critic learns beside the policy, in its own process
        calls.append(roles.critic.call("train_step", batch, critic_inputs["values"], critic_inputs["returns"]))
    roles.trainer_version = version
    return calls


def _wait_update(roles: "Roles", calls: list, with_critic: bool, r: Recipe) -> dict[str, float]:
    """Wait for :func:`_submit_update`'s calls (``timeouts.train_s``); rank 0's statistics with the critic's, and
    ``timing/train_s``: the longest of the ranks' (and the critic's) own update time, as each measured it."""
    updates = roles.get(calls, r.timeouts.train_s, "policy update", "timeouts.train_s")
    inner = [u.get(mn.TIMING_TRAIN_INNER_S, u.get(mn.TIMING_CRITIC_INNER_S, 0.0)) for u in updates]
    stats = {k: v for k, v in updates[0].items() if k != mn.TIMING_TRAIN_INNER_S}
    if with_critic:
        stats.update({k: v for k, v in updates[-1].items() if mn.namespace(k) != mn.NS_TIMING})
    stats[mn.TIMING_TRAIN_S] = slowest = max(inner)
    if mn.TRAIN_TOKENS in stats and slowest > 0:  # the batch's tokens (all epochs) over the slowest rank's seconds
        stats[mn.TRAIN_TOKENS_PER_S] = stats[mn.TRAIN_TOKENS] / slowest
    return stats
