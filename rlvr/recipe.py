"""Loading a recipe: read it by the schema (:mod:`rlvr.config`), resolve each named entry to its own settings
(the registries of :mod:`rlvr.algos`), and check every invariant, each message naming the key and the fix.

Imports the registries, not torch: the algorithm modules import torch on first use (:mod:`rlvr.lazy`), so
``load_recipe`` (and ``rlvr train --dry-run``) runs in a second. Errors: :class:`rlvr.config.RecipeError`.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

from rlvr.algos import ADVANTAGES, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
from rlvr.algos.gae import CRITIC_ADVANTAGES
from rlvr.algos.losses import correction_cap
from rlvr.config import (ENV_SOURCE, AlgorithmConfig, Recipe, RecipeError, Spec, TimeoutsConfig, build_settings,
                         gpu_processes, plain, read_recipe)
from rlvr.registry import Registry


def load_recipe(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Load a recipe YAML, apply ``section.key=value`` overrides (``algorithm.advantage.k=8`` reaches into an
    entry's settings), resolve each named entry's settings and check the whole recipe.

    Errors: :class:`RecipeError` naming the key and the fix (all problems at once); ``FileNotFoundError`` for a
    missing file.
    """
    recipe = resolve(read_recipe(path, overrides))
    _check(recipe)
    return recipe


def advantage_registry(name: str) -> Registry:
    """The registry that holds advantage estimator ``name``: :data:`rlvr.algos.gae.CRITIC_ADVANTAGES` (a learned
    critic is started) or :data:`rlvr.algos.advantages.ADVANTAGES` (also for an unknown name)."""
    return CRITIC_ADVANTAGES if name in CRITIC_ADVANTAGES else ADVANTAGES


def _resolve_spec(spec: Spec, reg: Registry, where: str, near_extra: list[str] = ()) -> tuple[Spec, list[str]]:
    """``spec`` with its settings built by its entry's class, and the problems found (then ``spec`` unchanged)."""
    if spec.name not in reg:
        names = reg.names() + list(near_extra)
        near = difflib.get_close_matches(spec.name, names, n=1)
        if where == "algorithm.advantage" and spec.name.lower() in ("ppo", "critic"):  # verl's "PPO" means a critic
            hint = "PPO with a learned critic is algorithm.advantage=gae (see recipes/methods/ppo.yaml)"
        else:
            hint = (f"did you mean '{near[0]}'? " if near else "") + f"choose from {sorted(names)}"
        return spec, [f"{where}={spec.name!r} is not registered: {hint}"]
    cls = reg.settings(spec.name)
    if isinstance(spec.settings, cls):
        return spec, []
    fields = spec.settings or {}
    if not isinstance(fields, dict):
        return spec, [f"{where}: settings {spec.settings!r} are not {cls.__name__} nor a mapping of its fields"]
    if fields and not dataclasses.fields(cls):
        return spec, [f"{where}={spec.name} takes no settings, got {sorted(fields)}: write "
                      f"{where.rsplit('.', 1)[-1]}: {spec.name}"]  # fmt: skip
    try:
        return Spec(spec.name, build_settings(cls, fields, where)), []
    except RecipeError as e:
        return spec, [str(e)]


def resolve(recipe: Recipe) -> Recipe:
    """``recipe`` with every named entry (:class:`rlvr.config.Spec`) resolved to its registered settings
    dataclass, defaults filled in, and ``algorithm.rollout_correction`` / ``algorithm.tis_cap`` resolved
    (:func:`resolved_correction`, :func:`rlvr.algos.losses.correction_cap`). Errors: :class:`RecipeError` listing
    each unknown name (with the nearest) and each unknown or mistyped setting (with the nearest field)."""
    al = recipe.algorithm
    adv_reg = advantage_registry(al.advantage.name)
    other = CRITIC_ADVANTAGES.names() if adv_reg is ADVANTAGES else ADVANTAGES.names()
    advantage, errs = _resolve_spec(al.advantage, adv_reg, "algorithm.advantage", other)
    policy_loss, loss_errs = _resolve_spec(al.policy_loss, POLICY_LOSSES, "algorithm.policy_loss")
    if errs + loss_errs:
        raise RecipeError("invalid recipe:\n  - " + "\n  - ".join(errs + loss_errs))
    mode = resolved_correction(al.rollout_correction, recipe.rollout.max_staleness, policy_loss.name)
    return dataclasses.replace(recipe, algorithm=dataclasses.replace(
        al, advantage=advantage, policy_loss=policy_loss, rollout_correction=mode,
        tis_cap=correction_cap(al.tis_cap, mode)))  # None: the mode's default (decoupled: AReaL's cap, 5)


def resolved_correction(mode: str, max_staleness: int, policy_loss: str) -> str:
    """``algorithm.rollout_correction`` as it runs: ``auto`` is AReaL's ``decoupled`` objective under asynchronous
    rollout (``max_staleness`` >= 1) with ``ppo_clip`` (the loss it is defined for), else ``tis`` (off at
    ``tis_cap: 0``; :func:`correction_errors` then refuses an uncorrected asynchronous run); other modes as given."""
    if mode != "auto":
        return mode
    return "decoupled" if max_staleness >= 1 and policy_loss == "ppo_clip" else "tis"


def correction_errors(r: Recipe) -> list[str]:
    """The lag correction against the loop and the loss (``r`` resolved): asynchronous rollout must be corrected
    or say ``none``; ``decoupled`` only under ``ppo_clip``; ``tis_cap`` in range for its mode."""
    errs: list[str] = []
    al, n = r.algorithm, r.rollout.max_staleness
    mode, cap, loss = al.rollout_correction, al.tis_cap, al.policy_loss.name
    if n >= 1 and mode == "tis" and cap == 0:
        errs.append(
            f"rollout.max_staleness={n} with algorithm.rollout_correction=tis and algorithm.tis_cap=0 trains the "
            f"on-policy gradient on samples {n} version(s) old with no correction (at one optimizer step the clip "
            "does nothing). Set algorithm.tis_cap (e.g. 2: truncated importance sampling), or "
            "algorithm.rollout_correction=decoupled (AReaL; policy_loss ppo_clip), or "
            "algorithm.rollout_correction=none to train uncorrected on purpose"
        )
    if mode == "decoupled" and loss != "ppo_clip":
        errs.append(
            f"algorithm.rollout_correction=decoupled with algorithm.policy_loss={loss}: AReaL's decoupled objective "
            f"is defined for the token-level PPO clip; under {loss} (a sequence ratio or an already "
            "importance-weighted loss) its token weight makes a hybrid no paper defines. Use policy_loss ppo_clip, "
            "or rollout_correction=tis with algorithm.tis_cap (e.g. 2)"
        )
    if mode == "none" and cap != 0:
        errs.append(f"algorithm.rollout_correction=none with algorithm.tis_cap={cap}: set tis_cap=0, or "
                    "rollout_correction=tis to use the cap")
    if mode == "decoupled" and cap != 0 and not cap > 1:
        errs.append(f"algorithm.tis_cap={cap} with rollout_correction=decoupled must be 0 (no cap) or > 1 "
                    "(tokens whose weight pi_prox / pi_behav exceeds it leave the loss; AReaL uses e.g. 5)")
    elif mode != "decoupled" and cap != 0 and not cap >= 1:
        errs.append(f"algorithm.tis_cap={cap} must be 0 (off) or >= 1 (a cap below 1 shrinks every token; 2 is common)")
    return errs


def non_default_keys(recipe: Recipe) -> dict[str, Any]:
    """The keys of ``recipe`` whose values differ from the defaults, dotted (``trainer.lr``) in the recipe's
    order, with their values as plain data (:func:`rlvr.config.plain`). The defaults are those of an empty
    recipe read the same way: ``model.dtype: auto`` resolved on this machine and every named entry's settings
    filled in, so only what a recipe or an override changed shows. A named entry under another name is one key
    with all its settings (``algorithm.advantage: {name: passk, k: 8}``); a list is one key."""
    return _differences(recipe, resolve(read_recipe()), "")


def _differences(value: Any, default: Any, prefix: str) -> dict[str, Any]:
    """Dotted key -> plain value of each field of the dataclass ``value`` that differs from ``default``'s."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        v, d, key = getattr(value, f.name), getattr(default, f.name), prefix + f.name
        if isinstance(v, Spec) and isinstance(d, Spec):
            if v.name == d.name and dataclasses.is_dataclass(v.settings) and type(v.settings) is type(d.settings):
                out.update(_differences(v.settings, d.settings, key + "."))
            elif plain(v) != plain(d):
                out[key] = plain(v)
        elif dataclasses.is_dataclass(v) and type(v) is type(d):
            out.update(_differences(v, d, key + "."))
        elif isinstance(v, dict) and isinstance(d, dict) and set(d) <= set(v):  # a free mapping (resources)
            out.update({f"{key}.{k}": plain(x) for k, x in v.items() if k not in d or plain(d[k]) != plain(x)})
        elif plain(v) != plain(d):
            out[key] = plain(v)
    return out


def _rollout_errors(r: Recipe) -> list[str]:
    """Engines, restarts and sampling settings."""
    errs: list[str] = []
    ro = r.rollout
    if ro.max_restarts < 0:
        errs.append("rollout.max_restarts must be >= 0")
    if r.run.max_restarts < 0 or r.run.restart_backoff_s < 0:
        errs.append(f"run.max_restarts ({r.run.max_restarts}) and run.restart_backoff_s ({r.run.restart_backoff_s}) "
                    "must be >= 0")
    if ro.num_engines < 1:
        errs.append("rollout.num_engines must be >= 1")
    elif ro.prompts_per_step % ro.num_engines:
        errs.append(
            f"rollout.prompts_per_step ({ro.prompts_per_step}) must divide evenly over "
            f"rollout.num_engines ({ro.num_engines})"
        )
    if r.run.executor == "local" and ro.engine == "vllm" and ro.num_engines > 1:
        errs.append(
            "run.executor=local holds every role in one process, and vLLM allows one engine per process: "
            "set run.executor=ray or rollout.num_engines=1"
        )
    if ro.temperature <= 0:
        errs.append("rollout.temperature must be > 0 for RL (sampled logprobs); use eval for greedy decoding")
    if not 0 < ro.top_p <= 1:
        errs.append("rollout.top_p must be in (0, 1]")
    elif ro.top_p < 1 or ro.top_k > 0:
        # case R2: vLLM's processed logprobs are renormalised over the kept tokens, the trainer's are not
        what = " and ".join(x for x in (f"rollout.top_p={ro.top_p}" if ro.top_p < 1 else "",
                                        f"rollout.top_k={ro.top_k}" if ro.top_k > 0 else "") if x)
        errs.append(
            f"{what} truncates the sampler: the engine's logprobs are "
            "then renormalised over the kept tokens while the trainer's cover the whole vocabulary (probabilities "
            "[.5, .3, .15, .05] at top_p 0.8: ratio 0.8 instead of 1), which biases truncated importance sampling, "
            "the KL in the reward, the DPH-RL buffer and the rollout/trainer gap metrics. Train with rollout.top_p: "
            "1.0 and rollout.top_k: -1 (lower rollout.temperature to sharpen sampling); `rlvr eval` may truncate"
        )
    if ro.max_new_tokens < 1:
        errs.append("rollout.max_new_tokens must be >= 1")
    if ro.max_staleness < 0:
        errs.append(f"rollout.max_staleness={ro.max_staleness} must be >= 0 (0: on-policy; 1: one step off-policy)")
    elif ro.max_staleness > 1 and not ro.in_flight_updates:
        errs.append(
            f"rollout.max_staleness={ro.max_staleness}: rlvr's asynchronous rollout keeps one generation in flight "
            "(the weight sync needs idle engines), so N > 1 only adds lag without more overlap (measured with "
            "benchmarks/async_speedup.py on uneven generation times: N = 2 no faster than N = 1). Use 1, or set "
            "rollout.in_flight_updates: true (the engines keep their requests across a sync)"
        )
    errs += in_flight_errors(r)
    for key, cpus in (("rollout.cpus", ro.cpus), ("trainer.cpus", r.trainer.cpus)):
        if any(c < 0 for c in cpus) or len(set(cpus)) != len(cpus):
            errs.append(f"{key}={list(cpus)} must list distinct core numbers >= 0 (os.cpu_count() shows how many)")
    if ro.tensor_parallel_size < 1:
        errs.append("rollout.tensor_parallel_size must be >= 1")
    elif ro.tensor_parallel_size > 1 and ro.engine != "vllm":
        errs.append(f"rollout.tensor_parallel_size={ro.tensor_parallel_size} needs rollout.engine=vllm (the hf engine "
                    "runs one process): set rollout.engine=vllm or rollout.tensor_parallel_size=1")
    elif ro.tensor_parallel_size > 1 and r.sync.probe_every == 0 and not r.sync.check:
        # the weight sync's checksums are of the full tensors each worker received, equal whatever shard it loaded;
        # the read-back (sync.check) and the probe are what see each worker's own shard
        errs.append(f"rollout.tensor_parallel_size={ro.tensor_parallel_size} with sync.check=false and "
                    "sync.probe_every=0: nothing would check that each tensor-parallel worker loaded its own shard of "
                    "the synced weights (every worker receives the full tensors, so their checksums agree even when "
                    "one loads the wrong shard): set sync.check=true (each worker reads back what it loaded), "
                    "sync.probe_every >= 1 (the engine's logprobs are compared with the trainer's), or "
                    "rollout.tensor_parallel_size=1")
    if not ro.kv_cache_gib > 0:
        errs.append(f"rollout.kv_cache_gib={ro.kv_cache_gib} must be > 0 GiB (the KV cache of each engine worker on CPU)")
    return errs


def in_flight_errors(r: Recipe) -> list[str]:
    """``rollout.in_flight_updates`` and ``rollout.in_flight_kv``: what they need (asynchronous rollout, the vLLM
    engine, full-weight sync), each message naming the key to change."""
    from rlvr.rollout.inflight import KV_MODES

    ro, errs = r.rollout, []
    if ro.in_flight_kv not in KV_MODES:
        errs.append(f"rollout.in_flight_kv={ro.in_flight_kv!r}: expected one of {', '.join(KV_MODES)}")
    if not ro.in_flight_updates:
        return errs
    if ro.max_staleness < 1:
        errs.append("rollout.in_flight_updates needs rollout.max_staleness >= 1 (the batches in flight while a step "
                    "trains); at 0 every batch is generated and trained in turn, with nothing in flight at a sync")
    if ro.engine != "vllm":
        errs.append(f"rollout.in_flight_updates needs rollout.engine: vllm (rollout.engine={ro.engine!r} cannot load "
                    "weights between decode steps)")
    if r.trainer.lora.adapter_sync:
        errs.append("rollout.in_flight_updates with trainer.lora.sync: adapter is not supported (a running request "
                    "keeps the adapter it started with); use trainer.lora.sync: merged")
    return errs


def resource_errors(r: Recipe) -> list[str]:
    """GPU counts and the Ray custom resources of each role (``*.resources``)."""
    errs: list[str] = []
    for where, gpus in (("trainer", r.trainer.num_gpus), ("rollout", r.rollout.num_gpus), ("critic", r.critic.num_gpus),
                        ("judge", r.judge.num_gpus), ("teacher", r.teacher.num_gpus)):  # fmt: skip
        if gpus < 0:
            errs.append(f"{where}.num_gpus must be >= 0, got {gpus}")
        elif gpus > 1 and gpus != int(gpus):
            errs.append(f"{where}.num_gpus={gpus}: above 1 a role takes whole GPUs (Ray's rule); use an integer")
    for where, res in (("trainer", r.trainer.resources), ("rollout", r.rollout.resources),
                       ("critic", r.critic.resources), ("reward", r.reward.resources),
                       ("judge", r.judge.resources), ("teacher", r.teacher.resources)):  # fmt: skip
        for k, v in res.items():
            if k in ("CPU", "GPU", "memory", "object_store_memory"):
                errs.append(f"{where}.resources names {k!r}, which Ray sets itself: use {where}.num_gpus (CPU, GPU) "
                            "and keep resources for custom node labels")  # fmt: skip
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                errs.append(f"{where}.resources.{k} must be a number > 0 (the amount per {where} actor), got {v!r}")
    return errs


DUPLICATE_GPU = 'NCCL refuses two ranks on one GPU ("Duplicate GPU detected")'
"""Why a weight sync over NCCL cannot run where its ranks share a device (named in :func:`gpu_errors`)."""


def gpu_errors(r: Recipe) -> list[str]:
    """Settings that would crash or misplace work on GPUs, refused at load (none apply on CPU):

    - ``sync.backend: nccl`` where the sync's ranks share a GPU (``run.executor: local``, every role in one
      process; or a fractional ``trainer.num_gpus`` / ``rollout.num_gpus``) or where one side has none
      (``num_gpus: 0``): NCCL needs one GPU per rank. The fix: ``sync.backend: gloo`` (or ``auto``).
    - ``rollout.tensor_parallel_size`` N > 1 with ``rollout.num_gpus`` in (0, 1): ``num_gpus`` is per engine
      worker, so an engine would hold ``N x num_gpus`` < N GPUs for N workers, which vLLM refuses (each
      tensor-parallel worker needs a GPU of its own). The fix: ``rollout.num_gpus: 1`` or
      ``rollout.tensor_parallel_size: 1``.
    """
    errs: list[str] = []
    tr, ro = r.trainer, r.rollout
    if r.sync.backend == "nccl":
        fractions = [f"{k}.num_gpus={g:g}" for k, g in (("trainer", tr.num_gpus), ("rollout", ro.num_gpus)) if 0 < g < 1]
        zero = [f"{k}.num_gpus=0" for k, g in (("trainer", tr.num_gpus), ("rollout", ro.num_gpus)) if g == 0]
        fix = "set sync.backend: gloo (or auto, which picks gloo there)"
        if r.run.executor == "local":
            errs.append(f"sync.backend=nccl with run.executor=local: every role runs in this one process, on one GPU, "
                        f"and {DUPLICATE_GPU}: {fix}")
        elif fractions:
            errs.append(f"sync.backend=nccl with {' and '.join(fractions)}: a fraction of a GPU shares the device with "
                        f"another role, and {DUPLICATE_GPU}: {fix}, or give trainer and rollout whole GPUs (num_gpus >= 1)")
        elif zero:
            errs.append(f"sync.backend=nccl with {' and '.join(zero)}: NCCL needs a GPU at every rank of the weight "
                        f"sync, and that role runs on CPU: {fix}, or give trainer and rollout whole GPUs (num_gpus >= 1)")
    tp = ro.tensor_parallel_size
    if tp > 1 and 0 < ro.num_gpus < 1:
        errs.append(f"rollout.tensor_parallel_size={tp} with rollout.num_gpus={ro.num_gpus:g}: num_gpus is per engine "
                    f"worker, so each engine would hold {tp} x {ro.num_gpus:g} = {tp * ro.num_gpus:g} GPUs for its {tp} "
                    "tensor-parallel workers, and vLLM needs a GPU per worker: set rollout.num_gpus: 1, or "
                    "rollout.tensor_parallel_size: 1")
    return errs


def gpu_sharing_errors(r: Recipe) -> list[str]:
    """Roles that would share a GPU they cannot share, refused at load (none apply on CPU). Ray packs fractional
    ``num_gpus`` onto one GPU where they fit (their sum <= 1), in whatever order the roles start, so each rule
    holds for every set of processes that fits on one GPU (:func:`rlvr.config.gpu_processes`):

    - trainer ranks: with ``trainer.num_workers`` >= 2 and ``0 < trainer.num_gpus <= 0.5`` two ranks fit on one
      GPU, and their data-parallel group is NCCL on CUDA (:mod:`rlvr.train.policy`), which refuses two ranks on one
      device (:data:`DUPLICATE_GPU`).
    - vLLM engines (rollout workers, the teacher's, the judge's): each reserves ``gpu_memory_utilization`` of the
      whole card when it starts, so the shares of the engines that fit on one GPU must sum below 1 (a sum of 1 or
      more fails at the second engine's start, and the memory model has no card for it); and
      ``rollout.gpu_memory_utilization`` must be in (0, 1] (the teacher's and judge's are checked with their
      sections).
    """
    from rlvr.reward.judge import JUDGE

    errs: list[str] = []
    tr, ro = r.trainer, r.rollout
    if not 0 < ro.gpu_memory_utilization <= 1:
        errs.append(f"rollout.gpu_memory_utilization={ro.gpu_memory_utilization} must be in (0, 1] (vLLM's share of "
                    "the GPU's memory per engine worker; e.g. 0.4)")  # fmt: skip
    if tr.num_workers >= 2 and 0 < tr.num_gpus <= 0.5:
        errs.append(f"trainer.num_gpus={tr.num_gpus:g} with trainer.num_workers={tr.num_workers}: Ray packs fractional "
                    f"GPUs, so {min(tr.num_workers, int(1 / tr.num_gpus))} trainer ranks would share one GPU, and the "
                    f"trainer's data-parallel group is NCCL on a GPU: {DUPLICATE_GPU}. Set trainer.num_gpus: 1 (a GPU "
                    "per rank; a fraction above 0.5 also keeps ranks apart, leaving the rest to an engine), or "
                    "trainer.num_workers: 1")  # fmt: skip
    judge = any(s.name == JUDGE for s in r.reward.verifiers) and r.judge.model is not None
    engines = [p for p in gpu_processes(r, teacher=r.teacher.model is not None, judge=judge)
               if p.role != "trainer" and 0 < p.fraction < 1 and p.share > 0]  # fmt: skip
    by_section: dict[str, list] = {}
    for p in engines:
        by_section.setdefault(p.section, []).append(p)
    sections = list(by_section)

    def best(i: int, room: float) -> tuple[float, dict[str, int]]:
        """The largest summed share of engines of sections[i:] fitting in ``room`` of one GPU, and their counts."""
        if i == len(sections):
            return 0.0, {}
        ps = by_section[sections[i]]
        top: tuple[float, dict[str, int]] = (0.0, {})
        for n in range(len(ps) + 1):
            if n * ps[0].fraction > room + 1e-9:
                break
            rest, counts = best(i + 1, room - n * ps[0].fraction)
            if n * ps[0].share + rest > top[0]:
                top = (n * ps[0].share + rest, {**counts, **({sections[i]: n} if n else {})})
        return top

    worst = best(0, 1.0)
    if worst[0] >= 1 - 1e-9:
        parts = [f"{n} x {s}.gpu_memory_utilization={by_section[s][0].share:g} ({s}.num_gpus="
                 f"{by_section[s][0].fraction:g} each)" if n > 1 else
                 f"{s}.gpu_memory_utilization={by_section[s][0].share:g} ({s}.num_gpus={by_section[s][0].fraction:g})"
                 for s, n in worst[1].items()]  # fmt: skip
        keys = " or ".join(f"{s}.gpu_memory_utilization" for s in worst[1])
        fix = f"lower {keys} so that they sum below 1 (room is also needed for a trainer rank on that GPU)"
        if list(worst[1]) == ["rollout"]:
            fix += f", e.g. rollout.gpu_memory_utilization={int(90 / worst[1]['rollout']) / 100:g}"
        errs.append(f"vLLM engines that fit on one GPU would take all of it or more: {' + '.join(parts)} = "
                    f"{worst[0]:.3g} of the card (each engine reserves its gpu_memory_utilization of the whole card "
                    f"when it starts, so the last to start fails). Either {fix}, or give the engines GPUs of their "
                    "own (num_gpus: 1)")  # fmt: skip
    return errs


def _batch_errors(r: Recipe) -> list[str]:
    """Mini-/micro-batch divisibility over ranks, ZeRO stage and learning rate."""
    errs: list[str] = []
    tr = r.trainer
    b = r.samples_per_step
    if tr.mini_batch_size and b % tr.mini_batch_size:
        errs.append(
            f"trainer.mini_batch_size ({tr.mini_batch_size}) must divide the samples per step "
            f"(prompts_per_step x samples_per_prompt = {b})"
        )
    mb = r.mini_batch
    if tr.mini_batch_size < 0 or tr.num_workers < 1 or tr.micro_batch_size < 1:
        errs.append(
            "trainer.mini_batch_size must be >= 0 (0: the whole batch), trainer.num_workers and "
            "trainer.micro_batch_size >= 1"
        )
    elif mb < 1:
        pass  # an empty batch: reported above (prompts_per_step / samples_per_prompt)
    elif mb % tr.num_workers:
        errs.append(f"the mini-batch ({mb}) must divide evenly over trainer.num_workers ({tr.num_workers})")
    elif (mb // tr.num_workers) % min(tr.micro_batch_size, mb // tr.num_workers):
        errs.append(
            f"trainer.micro_batch_size ({tr.micro_batch_size}) must divide the per-rank mini-batch "
            f"({mb // tr.num_workers}); e.g. set trainer.micro_batch_size={_divisor(mb // tr.num_workers, tr.micro_batch_size)}"
        )
    if tr.max_tokens_per_micro_batch < 0:
        errs.append(f"trainer.max_tokens_per_micro_batch must be >= 0 tokens (0: trainer.micro_batch_size sequences "
                    f"a micro-batch), got {tr.max_tokens_per_micro_batch}")
    if tr.zero_stage not in (0, 1, 2, 3):
        errs.append("trainer.zero_stage must be 0, 1, 2 or 3")
    if tr.lr <= 0:
        errs.append("trainer.lr must be > 0")
    return errs


def validate(r: Recipe) -> None:
    """Check the recipe's invariants (its named entries resolved first, :func:`resolve`); raise
    :class:`RecipeError` listing every problem, each with the fix."""
    _check(resolve(r))


def environment_errors(r: Recipe) -> list[str]:
    """The ``environment:`` and ``tools:`` sections' own bounds (multi-turn rollouts; none when both are off)."""
    e, t = r.environment, r.tools
    if not (e.enabled or t.enabled):
        return []
    errs = []
    if t.enabled and (not t.timeout_s > 0 or t.max_output_chars < 1 or t.max_calls_per_turn < 1 or t.num_workers < 1):
        errs.append("tools.timeout_s must be > 0, tools.max_output_chars, tools.max_calls_per_turn and "
                    "tools.num_workers >= 1")
    if t.enabled and t.memory_mb is not None and t.memory_mb < 256:
        errs.append("tools.memory_mb must be >= 256 or null for no limit")
    if e.max_turns < 1 or e.num_workers < 1 or not e.timeout_s > 0:
        errs.append("environment.max_turns and environment.num_workers must be >= 1, environment.timeout_s > 0")
    if e.max_tokens < r.rollout.max_new_tokens:
        errs.append(f"environment.max_tokens={e.max_tokens} is less than one turn's rollout.max_new_tokens="
                    f"{r.rollout.max_new_tokens}: raise environment.max_tokens (a trajectory's whole budget)")
    if e.max_observation_tokens < 0 or not 0 < e.turn_discount <= 1:
        errs.append("environment.max_observation_tokens must be >= 0 (0: no cap) and environment.turn_discount in "
                    "(0, 1]")
    if e.memory_mb is not None and e.memory_mb < 256:
        errs.append("environment.memory_mb must be >= 256 or null for no limit")
    w = e.warn_failure_frac
    if w is not None and not 0 < w <= 1:
        errs.append(f"environment.warn_failure_frac={w} must be in (0, 1] (the share of a step's trajectories that may "
                    "fail before a warning; e.g. 0.25), or null to never warn")  # fmt: skip
    return errs


def _check(r: Recipe) -> None:
    """:func:`validate` of a recipe already resolved."""
    errs: list[str] = []
    ro, al = r.rollout, r.algorithm
    if r.run.steps < 1:
        errs.append("run.steps must be >= 1")
    if ro.prompts_per_step < 1 or ro.samples_per_prompt < 1:
        errs.append("rollout.prompts_per_step and rollout.samples_per_prompt must be >= 1")
    errs.extend(_rollout_errors(r))
    errs.extend(_batch_errors(r))
    errs.extend(resource_errors(r))
    errs.extend(gpu_errors(r))
    errs.extend(gpu_sharing_errors(r))  # issue 38 item 12: NCCL ranks or engine shares that cannot share a GPU
    if al.ppo_epochs < 1:
        errs.append("algorithm.ppo_epochs must be >= 1")
    if al.kl_coef < 0:
        errs.append("algorithm.kl_coef must be >= 0")
    errs.extend(correction_errors(r))
    errs.extend(dapo_errors(al, ro.samples_per_prompt, *r.response_budget))
    errs.extend(extra_errors(r))
    errs.extend(lora_errors(r))
    errs.extend(judge_errors(r))
    errs.extend(teacher_errors(r))
    errs.extend(verifier_errors(r))
    errs.extend(environment_errors(r))
    errs.extend(multiturn_errors(r))  # issue 38: an environment reward no one gives, raw text with chat turns
    for k in r.metrics.pass_k:
        if not 1 <= k <= ro.samples_per_prompt:
            errs.append(
                f"metrics.pass_k has k={k}: pass@k needs 1 <= k <= samples_per_prompt ({ro.samples_per_prompt})"
            )
    if not r.reward.verifiers:
        errs.append("reward.verifiers is empty: name at least one verifier (e.g. - name: math)")
    if r.reward.timeout_s <= 0:
        errs.append("reward.timeout_s must be > 0")
    if r.reward.num_workers < 1:
        errs.append("reward.num_workers must be >= 1")
    if r.reward.memory_mb is not None and r.reward.memory_mb < 256:
        errs.append("reward.memory_mb must be >= 256 (math-verify and sympy need room) or null for no limit")
    if "{question}" not in r.data.prompt_template:
        errs.append("data.prompt_template must contain {question}")
    va = r.validation
    if va.every_steps < 0 or va.samples < 1 or va.temperature <= 0:
        errs.append("validation.every_steps must be >= 0, validation.samples >= 1, validation.temperature > 0")
    rg = r.data.source.startswith(("reasoning_gym:", ENV_SOURCE))
    if va.every_steps and va.source is None and r.data.source != "generated" and not rg:
        errs.append(
            f"validation.every_steps={va.every_steps} with data.source={r.data.source!r}: set validation.source to a "
            "held-out file or data set (only a generated, reasoning_gym or env: source has a built-in holdout split)"
        )
    if va.every_steps and va.source is None and r.data.source == "generated" and r.data.generated.holdout == 0:
        errs.append("validation needs held-out rows: set data.generated.holdout > 0 (e.g. 64) or validation.source")
    if va.every_steps and va.source is None and rg:
        key = "env_rows" if r.data.source.startswith(ENV_SOURCE) else "reasoning_gym"
        if getattr(r.data, key).holdout == 0:
            errs.append(f"validation needs held-out rows: set data.{key}.holdout > 0 (e.g. 64) or validation.source")
    for f in dataclasses.fields(TimeoutsConfig):
        if not getattr(r.timeouts, f.name) > 0:
            errs.append(f"timeouts.{f.name} must be > 0 seconds, got {getattr(r.timeouts, f.name)}")
    if r.sync.timeout_s <= 0:
        errs.append("sync.timeout_s must be > 0")
    if not r.sync.bucket_mb >= 0:
        errs.append(f"sync.bucket_mb must be >= 0 MB (0: one broadcast per parameter), got {r.sync.bucket_mb}")
    if r.sync.probe_every < 0 or (r.sync.probe_tolerance is not None and not r.sync.probe_tolerance > 0):
        errs.append("sync.probe_every must be >= 0 (0: off) and sync.probe_tolerance > 0 nats (or null: by dtype)")
    errs.extend(registry_errors(r))  # names in registries, and what their entries need (capability flags)
    if errs:
        raise RecipeError("invalid recipe:\n  - " + "\n  - ".join(errs))


def _divisor(n: int, below: int) -> int:
    return max(d for d in range(1, min(n, below) + 1) if n % d == 0)


def dapo_errors(al: AlgorithmConfig, g: int, budget_key: str, budget: int) -> list[str]:
    """Invariants of DAPO's dynamic sampling and overlong settings (G = samples per prompt)."""
    errs = []
    if al.dynamic_sampling_max_rounds < 0:
        errs.append(f"algorithm.dynamic_sampling_max_rounds={al.dynamic_sampling_max_rounds} must be >= 0")
    if al.dynamic_sampling and al.dynamic_sampling_max_rounds < 1:
        errs.append(
            "algorithm.dynamic_sampling=true needs algorithm.dynamic_sampling_max_rounds >= 1 (extra generation "
            "rounds to replace uninformative groups; DAPO-style runs use a few, e.g. 3)"
        )
    if al.dynamic_sampling and g < 2:
        errs.append(
            "algorithm.dynamic_sampling=true keeps groups whose rewards differ, and a group of one sample never "
            "does: set rollout.samples_per_prompt >= 2 or algorithm.dynamic_sampling=false"
        )
    b = al.overlong_buffer
    if not 0 <= b < budget:  # the limit a sample's length is held to: a trajectory's is its token budget
        errs.append(
            f"algorithm.overlong_buffer={b} must be in [0, {budget_key} - 1 = {budget - 1}] "
            f"(0: off; it is the penalised tail of the length limit): e.g. set algorithm.overlong_buffer="
            f"{max(budget // 4, 0)}"
        )
    if al.overlong_penalty < 0:
        errs.append(f"algorithm.overlong_penalty={al.overlong_penalty} must be >= 0 (it is subtracted from the reward)")
    return errs


def extra_errors(r: Recipe) -> list[str]:
    """Invariants of the entropy bonus, critic, DPH-RL, checkpoint and failure settings."""
    al, cr, ck = r.algorithm, r.critic, r.checkpoint
    errs = []
    if al.entropy_coef < 0:
        errs.append(f"algorithm.entropy_coef={al.entropy_coef} must be >= 0 (0: off; e.g. 0.001)")
    if cr.value_clip < 0:
        errs.append(f"critic.value_clip={cr.value_clip} must be >= 0 (0: no value clipping)")
    if al.dph_coef < 0 or al.dph_prompts < 1 or al.dph_batch < 1:
        errs.append("algorithm.dph_coef must be >= 0, dph_prompts and dph_batch >= 1")
    if al.dph_divergence != "none" and al.dph_coef == 0:
        errs.append(f"algorithm.dph_divergence={al.dph_divergence} needs algorithm.dph_coef > 0 (e.g. 0.1)")
    if cr.lr <= 0 or cr.micro_batch_size < 1 or cr.grad_clip < 0:
        errs.append("critic.lr must be > 0, critic.micro_batch_size >= 1, critic.grad_clip >= 0")
    if ck.every_steps < 0:
        errs.append(f"checkpoint.every_steps={ck.every_steps} must be >= 0 (0: only at the end)")
    if ck.keep_last < 0:
        errs.append(f"checkpoint.keep_last={ck.keep_last} must be >= 1 (keep the newest K) or 0 (keep every "
                    "checkpoint; rlvr's 'keep all' is 0, not -1)")
    if r.trainer.max_nonfinite_in_row < 1:
        errs.append("trainer.max_nonfinite_in_row must be >= 1")
    if r.metrics.samples_every < 0 or r.metrics.samples_rows < 1:
        errs.append("metrics.samples_every must be >= 0 (0: off) and metrics.samples_rows >= 1")
    return errs


def lora_errors(r: Recipe) -> list[str]:
    """``trainer.lora`` on its own and against the trainer: rank >= 0; with rank > 0, alpha > 0, dropout in
    [0, 1), target names given (``all-linear`` alone), ``sync: adapter`` only with the vLLM engine and a rank
    vLLM serves (<= 512), and a ZeRO stage below 3. What needs the model (targets that match nothing, a rank over a module's smallest dimension)
    is checked by :func:`rlvr.runtime.checks.preflight` (:func:`rlvr.train.lora.lora_target_errors`)."""
    lo, tr = r.trainer.lora, r.trainer
    if lo.rank < 0:
        return [f"trainer.lora.rank={lo.rank} must be >= 0 (0: off, full fine-tuning; e.g. 16)"]
    if lo.rank == 0:
        return []
    errs = []
    if not lo.alpha > 0:
        errs.append(f"trainer.lora.alpha={lo.alpha} must be > 0 (the adapter is scaled by alpha / rank; e.g. 32)")
    if not 0 <= lo.dropout < 1:
        errs.append(f"trainer.lora.dropout={lo.dropout} must be in [0, 1) (0: none)")
    if not lo.target_modules:
        errs.append("trainer.lora.target_modules is empty: name the Linear modules that get adapters (e.g. "
                    "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]) or [all-linear]")
    elif "all-linear" in lo.target_modules and len(lo.target_modules) > 1:
        errs.append(f"trainer.lora.target_modules={list(lo.target_modules)}: all-linear already targets every "
                    "Linear but the output layer; give it alone or list module names without it")
    if lo.sync == "adapter" and r.rollout.engine != "vllm":
        errs.append(f"trainer.lora.sync=adapter with rollout.engine={r.rollout.engine}: only the vLLM engine serves "
                    "LoRA adapters; use trainer.lora.sync=merged (full weights with the adapters folded in, every "
                    "engine) or rollout.engine=vllm")
    if lo.sync == "adapter" and lo.rank > 512:
        errs.append(f"trainer.lora.rank={lo.rank} with trainer.lora.sync=adapter: vLLM serves LoRA ranks up to 512; "
                    "use trainer.lora.sync=merged or a rank <= 512")
    if tr.backend == "deepspeed" and tr.zero_stage == 3:
        errs.append(f"trainer.lora.rank={lo.rank} with trainer.zero_stage=3 is not supported (the merged sync and "
                    "the adapter checkpoints are built for unpartitioned weights): use trainer.zero_stage=2 (LoRA's "
                    "optimizer state is the adapters' alone, so ZeRO-3 would save little)")
    return errs


def verifier_errors(r: Recipe) -> list[str]:
    """The verifiers' keys (``reward.verifiers[i].key``, and two verifiers that would share one:
    :func:`rlvr.reward.pool.verifier_keys`) and ``reward.warn_error_frac``."""
    from rlvr.reward.judge import JUDGE
    from rlvr.reward.pool import verifier_keys

    errs: list[str] = []
    w = r.reward.warn_error_frac
    if w is not None and not 0 < w <= 1:
        errs.append(f"reward.warn_error_frac={w} must be in (0, 1] (the share of a step's samples a verifier may "
                    "fail before a warning; e.g. 0.25), or null to never warn")  # fmt: skip
    bad_key = False
    for i, spec in enumerate(r.reward.verifiers):
        if spec.key is not None and spec.name == JUDGE:
            bad_key = True
            errs.append(f"reward.verifiers[{i}].key={spec.key!r}: a judge verifier is keyed 'judge' ('judge#2' for a "
                        "second; the sample tables read that key): remove its key")  # fmt: skip
        elif spec.key is not None and (not spec.key.strip() or any(c.isspace() or c == "#" for c in spec.key)):
            bad_key = True
            errs.append(f"reward.verifiers[{i}].key={spec.key!r} must be a non-empty name without spaces or '#' "
                        "(it names reward/score/<key>; e.g. key: correct)")  # fmt: skip
    if not bad_key:
        try:
            verifier_keys(r.reward.verifiers)
        except ValueError as e:
            errs.append(str(e))
    return errs


def judge_errors(r: Recipe) -> list[str]:
    """The judge verifier (``reward.verifiers: - name: judge``), its settings, the ``judge:`` role and FAPO's
    ``algorithm.flawed_penalty`` (:mod:`rlvr.reward.judge`)."""
    from rlvr.reward.judge import JUDGE, settings_of

    errs: list[str] = []
    specs, jg = r.reward.verifiers, r.judge
    judges = [i for i, s in enumerate(specs) if s.name == JUDGE]
    if judges and judges[0] == 0:
        errs.append("reward.verifiers[0] is the judge, but the primary (first) verifier must be a rule verifier "
                    "(e.g. math): its full marks define a correct sample (pass@k, only_correct, the flawed "
                    "positives); put the judge after it")  # fmt: skip
    if judges and jg.model is None:
        errs.append(f"reward.verifiers[{judges[0]}] is a judge verifier but judge.model is not set: set judge.model "
                    "to a model path or embedded name (e.g. judge.model=smollm2-135m-instruct), or remove the "
                    "judge verifier")  # fmt: skip
    for i in judges:
        where = f"reward.verifiers[{i}].args"
        try:
            js = settings_of(specs[i], where)
        except RecipeError as e:
            errs.append(str(e))
            continue
        errs.extend(js.errors(where))
        if js.max_new_tokens >= jg.max_model_len:
            errs.append(f"{where}.max_new_tokens={js.max_new_tokens} leaves no room for the prompt in "
                        f"judge.max_model_len={jg.max_model_len}: raise judge.max_model_len or lower max_new_tokens")
    al = r.algorithm
    if al.flawed_penalty < 0:
        errs.append(f"algorithm.flawed_penalty={al.flawed_penalty} must be >= 0 (0: off; FAPO: 0.5 in rlvr's 0/1 "
                    "units); it is subtracted from a flawed positive's reward")
    elif al.flawed_penalty > 0 and not judges:
        errs.append(f"algorithm.flawed_penalty={al.flawed_penalty} needs a judge verifier to find flawed positives: "
                    "add `- {name: judge, weight: 0.0, args: {...}}` to reward.verifiers and set judge.model "
                    "(see recipes/methods/fapo.yaml), or set algorithm.flawed_penalty=0")  # fmt: skip
    if jg.threads < 1 or not jg.kv_cache_gib > 0 or jg.max_model_len < 2 or not 0 < jg.gpu_memory_utilization <= 1:
        errs.append("judge.threads must be >= 1, judge.kv_cache_gib > 0, judge.max_model_len >= 2 and "
                    "judge.gpu_memory_utilization in (0, 1]")  # fmt: skip
    return errs


def teacher_errors(r: Recipe) -> list[str]:
    """The teacher role (``teacher:``) against an estimator that needs it (``needs_teacher``: ``distill``): one
    without the other is refused, naming what to set. The teacher's tokenizer is compared with the student's by
    :func:`rlvr.runtime.checks.check_teacher_tokenizer` (it loads both tokenizers, so not here)."""
    errs: list[str] = []
    al, tc = r.algorithm, r.teacher
    needs = advantage_registry(al.advantage.name).flag(al.advantage.name, "needs_teacher")
    if needs and tc.model is None:
        errs.append(f"algorithm.advantage={al.advantage.name} scores the student's samples with a teacher, but "
                    "teacher.model is not set: set teacher.model to a model folder or embedded name (e.g. a run's "
                    "final/ folder)")  # fmt: skip
    if tc.model is not None and not needs:
        errs.append(f"teacher.model={tc.model!r} is set but algorithm.advantage={al.advantage.name} does not use a "
                    "teacher: set algorithm.advantage=distill (see recipes/methods/distill.yaml) or remove the "
                    "teacher: section")  # fmt: skip
    if tc.threads < 1 or not tc.kv_cache_gib > 0 or not 0 < tc.gpu_memory_utilization <= 1:
        errs.append("teacher.threads must be >= 1, teacher.kv_cache_gib > 0 and teacher.gpu_memory_utilization in "
                    "(0, 1]")  # fmt: skip
    temp = r.rollout.temperature
    if needs and temp != 1.0 and temp > 0:  # issue 38 item 5 (temperature <= 0 is refused on its own)
        errs.append(f"algorithm.advantage={al.advantage.name} with rollout.temperature={temp}: the teacher scores at "
                    "temperature 1 (vLLM's prompt logprobs ignore a temperature, rlvr.rollout.teacher.TeacherWorker."
                    f"score) while log p_S is the sampler's at {temp}, so the advantage log p_T - log p_S would "
                    "compare two temperatures (a teacher equal to the student would still give a nonzero advantage). "
                    "Set rollout.temperature=1.0")  # fmt: skip
    return errs


def multiturn_errors(r: Recipe) -> list[str]:
    """Settings a multi-turn rollout (:mod:`rlvr.envs`) cannot honour, refused at load:

    - ``environment.reward: environment`` or ``both`` where no environment is named (``environment.name`` and
      ``environment.row_field`` unset): nothing gives an environment reward (the rollout counts a missing one as
      0, :func:`rlvr.envs.rollout.trajectory_rewards`), so under ``environment`` every reward would be 0 (a
      tools-only recipe), under ``both`` the verifiers' alone; single-turn, the key is never read.
    - ``data.chat_template: false`` with an environment or tools: a trajectory's later turns are chat messages
      rendered by the tokenizer's chat template (token-in/token-out, :mod:`rlvr.envs.tokens`), the first prompt
      would be raw text, so one sequence would mix the two formats.
    """
    errs: list[str] = []
    e, t = r.environment, r.tools
    named = e.name is not None or e.row_field is not None
    if e.reward != "verifiers" and not named:
        if t.enabled:
            outcome = ("every reward would be 0" if e.reward == "environment"
                       else "the reward would be the verifiers' alone")  # fmt: skip
            what = (f"tools ({', '.join(t.names)}) but no environment (environment.name and environment.row_field "
                    f"unset): a tool answers calls and gives no reward, and nothing else does, so {outcome}")
        else:
            what = ("no environment or tools: a single-turn rollout never reads environment.reward (the verifiers "
                    "score every sample), so the setting would be ignored")
        errs.append(f"environment.reward={e.reward} with {what}. Set environment.reward=verifiers (the recipe's "
                    "verifiers score the final answer, as tools-only recipes do), or name an environment that "
                    "returns rewards (environment.name)")  # fmt: skip
    env_verifiers = [i for i, v in enumerate(r.reward.verifiers) if v.name == "environment"]
    if env_verifiers and not named:
        errs.append(f"reward.verifiers[{env_verifiers[0]}] is `environment` (the environment's last reward as the "
                    "score) but no environment is named: set environment.name (or environment.row_field), or use a "
                    "verifier that checks the answer (math, ...)")
    if r.data.source.startswith(ENV_SOURCE) and not named:
        errs.append(f"data.source={r.data.source!r} takes rows from an environment, but environment.name is unset: "
                    "name the environment that plays them")
    if not r.data.chat_template and (e.enabled or t.enabled):
        uses = " and ".join(x for x in (f"environment.name={e.name}" if e.name else "",
                                        f"environment.row_field={e.row_field}" if e.row_field else "",
                                        f"tools.names={list(t.names)}" if t.enabled else "") if x)  # fmt: skip
        errs.append(f"data.chat_template=false with {uses}: a multi-turn trajectory's later turns (the environment's "
                    "and tools' messages, the model's replies) are chat turns rendered by the tokenizer's chat "
                    "template, while chat_template=false gives the first prompt as raw text, so one sequence would "
                    "mix raw text and chat turns. Set data.chat_template=true (a model with a chat template), or "
                    "drop the environment and tools for a raw-text single-turn run")  # fmt: skip
    return errs


def registry_errors(r: Recipe) -> list[str]:
    """Names in the registries (a typo fails before anything starts, naming the nearest entry), each entry's own
    invariants (its settings' ``errors(recipe, where)``), and what the chosen entries declare they need
    (:meth:`rlvr.registry.Registry.flag`): ``needs_groups`` (G >= 2), ``binary_rewards`` (no fractional shaping), a
    policy loss's ``sequence_advantages`` against an estimator or KL placement that gives ``token_advantages``."""
    al, g = r.algorithm, r.rollout.samples_per_prompt
    adv, loss = al.advantage.name, al.policy_loss.name
    adv_reg = advantage_registry(adv)
    errs: list[str] = []
    for spec, where in ((al.advantage, "algorithm.advantage"), (al.policy_loss, "algorithm.policy_loss")):
        check = getattr(spec.settings, "errors", None)
        if check is not None:
            errs.extend(check(r, where))
    if g < 2 and adv_reg.flag(adv, "needs_groups"):
        errs.append(f"algorithm.advantage={adv} compares samples within a group: set rollout.samples_per_prompt >= 2")
    shaped = al.overlong_buffer > 0 and al.overlong_penalty > 0
    if shaped and adv_reg.flag(adv, "binary_rewards"):
        errs.append(f"algorithm.advantage={adv} needs binary (0/1) rewards, and the overlong penalty "
                    "(algorithm.overlong_buffer > 0) makes them fractional: set algorithm.overlong_buffer=0")  # fmt: skip
    if al.flawed_penalty > 0 and adv_reg.flag(adv, "binary_rewards"):
        errs.append(f"algorithm.advantage={adv} needs binary (0/1) rewards, and FAPO's flawed-positive penalty "
                    "(algorithm.flawed_penalty > 0) makes them fractional: set algorithm.flawed_penalty=0 or use "
                    "advantage=grpo")  # fmt: skip
    kl_tokens = al.kl_coef > 0 and al.kl_penalty == "reward"
    token_adv = adv_reg.flag(adv, "token_advantages") or kl_tokens
    if token_adv and POLICY_LOSSES.flag(loss, "sequence_advantages"):
        errs.append(
            f"algorithm.policy_loss={loss} needs one advantage per sequence, but "
            + ("kl_penalty=reward" if kl_tokens and not adv_reg.flag(adv, "token_advantages") else "advantage=" + adv)
            + " gives one per token: use policy_loss=ppo_clip (or kl_penalty=loss)"
        )
    for reg, name, key in (
        (LOSS_AGGREGATIONS, al.loss_agg, "algorithm.loss_agg"),
        (KL_ESTIMATORS, al.kl_estimator, "algorithm.kl_estimator"),
    ):
        if name not in reg:
            near = difflib.get_close_matches(name, reg.names(), n=1)
            hint = f"did you mean '{near[0]}'?" if near else f"choose from {reg.names()}"
            errs.append(f"{key}={name!r} is not registered: {hint}")
    return errs
