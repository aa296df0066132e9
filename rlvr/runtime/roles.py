"""The roles of a run and the plumbing between them: spawning (through an executor), waits with deadlines,
engine restarts, and the weight-sync group between trainer rank 0 and the engines.

:class:`Roles` holds the role handles the step loop (:mod:`rlvr.runtime.controller`) and the rollout stage
(:mod:`rlvr.runtime.rollout_stage`, which generates and scores on them) call: ``engines``, ``reward``, ``judge``
(the model-backed verifier, :mod:`rlvr.reward.judge`; None without one), ``teacher`` (on-policy distillation,
:mod:`rlvr.rollout.teacher`; None without one), ``trainers``, ``critic``, ``turns`` (the multi-turn turn loop; None
without an environment or tools), with ``get`` / ``as_completed`` (waits on remote calls, deadline from the recipe),
``sync``, ``restart_dead_engines`` and the reference, teacher and critic calls of the advantage stage.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from rlvr.config import Recipe
from rlvr.environ import comm_env
from rlvr.metrics import names as mn
from rlvr.reward.judge import JUDGE, rule_specs
from rlvr.rollout import engine_class
from rlvr.runtime.advantage_stage import uses_critic, uses_teacher
from rlvr.runtime.executors import Group, Handle, LocalExecutor, RayExecutor, Resources, RoleError
from rlvr.seeding import engine_seed
from rlvr.sync.readback import check_loaded
from rlvr.sync.weights import WeightSpec, WeightSyncError, check_specs, checksums_match

log = logging.getLogger("rlvr")


def role_env(recipe: Recipe, run_dir: Path, threads: int) -> dict[str, str]:
    """Environment for every role process: thread counts, caches inside writable places, and the launcher's
    NCCL / gloo settings (:func:`rlvr.environ.comm_env`: every rank of a group needs the same). The engines' own
    settings (KV cache, vLLM's thread binding) are theirs to pass to vLLM
    (:class:`rlvr.rollout.vllm_engine.VLLMEngine`), not variables shared by every role."""
    cache = os.environ.get("RLVR_CACHE", str(Path.home() / ".cache" / "rlvr"))
    env = {
        "OMP_NUM_THREADS": str(max(1, threads)),
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(Path(cache) / "vllm")),
        # vLLM logs every weight of a reload at WARNING; the step lines are what a user reads
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(Path(cache) / "torch_extensions")),
        "RLVR_CACHE": cache,
        "PYTHONUNBUFFERED": "1",
    }
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTHONPATH"):
        if k in os.environ:
            env[k] = os.environ[k]
    env.update(comm_env())  # NCCL / gloo settings every rank of a group must share (rlvr.environ.COMM_ENV)
    return env


ROLE_CPUS = 0.1
"""Ray CPUs reserved per role (per engine worker): nominal, so that every role fits a 2-core machine; a role's
real thread count is its ``*.threads`` setting."""


def default_executor(recipe: Recipe, run_dir: Path) -> Any:
    """The executor ``run.executor`` names: a :class:`LocalExecutor`, or a :class:`RayExecutor` (``run.ray_address``,
    ``run.num_cpus``) whose actors start with :func:`role_env`."""
    r = recipe
    if r.run.executor == "local":
        return LocalExecutor()
    return RayExecutor(r.run.ray_address, r.run.num_cpus, role_env(r, run_dir, r.rollout.threads))


def role_resources(recipe: Recipe, env: dict[str, str]) -> dict[str, list[Resources]]:
    """What each role asks of the cluster, by placement group: ``trainer`` (one bundle per rank, packed onto as
    few nodes as hold them), ``engines`` (one bundle per engine: all its tensor-parallel workers, so on one node),
    ``reward``, ``judge`` when a verifier asks the judge role (:func:`uses_judge`), ``teacher`` with on-policy
    distillation (:func:`rlvr.runtime.advantage_stage.uses_teacher`) and, when the recipe trains a
    critic, ``critic``. CPUs are nominal (:data:`ROLE_CPUS` per role: the roles' threads
    are set by ``*.threads``); GPUs and custom resources come from the recipe (``*.num_gpus``, ``*.resources``)."""
    r = recipe
    tenv = dict(env, OMP_NUM_THREADS=str(max(1, r.trainer.threads)))
    tp = r.rollout.tensor_parallel_size
    out = {
        "trainer": [Resources(num_cpus=ROLE_CPUS, num_gpus=r.trainer.num_gpus, env=tenv, custom=dict(r.trainer.resources),
                              group="trainer", bundle=k) for k in range(r.trainer.num_workers)],  # fmt: skip
        "engines": [Resources(num_cpus=ROLE_CPUS * tp, num_gpus=r.rollout.num_gpus * tp, env=env,
                              custom=dict(r.rollout.resources), group="engines", bundle=i,
                              concurrency=engine_concurrency(r))
                    for i in range(r.rollout.num_engines)],  # fmt: skip
        "reward": [Resources(num_cpus=ROLE_CPUS, env=env, custom=dict(r.reward.resources), group="reward")],
    }
    if uses_judge(r):
        jenv = dict(env, OMP_NUM_THREADS=str(max(1, r.judge.threads)))  # its KV cache: an engine argument
        out["judge"] = [Resources(num_cpus=ROLE_CPUS, num_gpus=r.judge.num_gpus, env=jenv, custom=dict(r.judge.resources),
                                  group="judge")]  # fmt: skip
    if uses_teacher(r):
        tcenv = dict(env, OMP_NUM_THREADS=str(max(1, r.teacher.threads)))  # its KV cache: an engine argument
        out["teacher"] = [Resources(num_cpus=ROLE_CPUS, num_gpus=r.teacher.num_gpus, env=tcenv,
                                    custom=dict(r.teacher.resources), group="teacher")]  # fmt: skip
    if uses_critic(r):
        cenv = dict(env, OMP_NUM_THREADS=str(max(1, r.critic.threads)))
        out["critic"] = [Resources(num_cpus=ROLE_CPUS, num_gpus=r.critic.num_gpus, env=cenv, custom=dict(r.critic.resources),
                                   group="critic")]  # fmt: skip
    return out


def engine_concurrency(recipe: Recipe) -> int:
    """How many calls an engine takes at once: 1 (in order) unless ``rollout.in_flight_updates``, where its N
    batches in flight (``rollout.max_staleness``), each multi-turn round's calls, a regeneration, and a sync with
    its read-back and probe all wait on it together (they are queued in its own loop,
    :class:`rlvr.rollout.inflight.EngineLoop`): N + 6."""
    return recipe.rollout.max_staleness + 6 if recipe.rollout.in_flight_updates else 1


def uses_judge(recipe: Recipe) -> bool:
    """True when some verifier of ``reward.verifiers`` is ``name: judge`` (the judge role is started)."""
    return any(s.name == JUDGE for s in recipe.reward.verifiers)


GROUP_SETTINGS = {
    "trainer": "trainer.num_workers, trainer.num_gpus, trainer.resources",
    "engines": "rollout.num_engines, rollout.tensor_parallel_size, rollout.num_gpus, rollout.resources",
    "reward": "reward.resources",
    "judge": "judge.num_gpus, judge.resources",
    "critic": "critic.num_gpus, critic.resources",
    "teacher": "teacher.num_gpus, teacher.resources",
}
"""The recipe keys that size each group of :func:`role_resources` (named when a group does not fit)."""


def placement_groups(resources: dict[str, list[Resources]]) -> list[Group]:
    """One :class:`Group` per role group of :func:`role_resources` (``PACK``: as few nodes as hold them), with
    the recipe keys that size it (:data:`GROUP_SETTINGS`)."""
    return [Group(name, tuple(x.bundle_dict() for x in res), "PACK", GROUP_SETTINGS.get(name, ""))
            for name, res in resources.items()]


def shares_devices(recipe: Recipe) -> bool:
    """True when the engines (and the judge) may share a GPU with the trainer or with each other:
    ``run.executor: local`` (every role in one process, on one device), or a fraction of a GPU (``0 < num_gpus < 1``) for the
    rollout, trainer, judge, teacher or critic (Ray packs fractions onto one GPU). There vLLM's start, which measures the
    free GPU memory to size its KV cache (``gpu_memory_utilization``), must not overlap another role's allocations:
    :class:`Roles` then starts the vLLM roles one after another, each finished before the next role is created."""
    r = recipe
    judge_gpus = r.judge.num_gpus if uses_judge(r) else 0.0
    critic_gpus = r.critic.num_gpus if uses_critic(r) else 0.0
    teacher_gpus = r.teacher.num_gpus if uses_teacher(r) else 0.0
    fractions = any(0 < g < 1 for g in (r.rollout.num_gpus, r.trainer.num_gpus, judge_gpus, critic_gpus, teacher_gpus))
    return r.run.executor == "local" or fractions


class Roles:
    """Spawns the roles of a run and owns the weight-sync group between trainer rank 0 and the engines.

    Start-up: the placement groups are reserved (the Ray executor; a recipe asking for more than the cluster has
    fails here), the roles spawned into them (engines, judge, teacher, reward worker, trainer ranks, critic; where a
    GPU is shared, :func:`shares_devices`, each engine, the judge and the teacher finished before the next role is
    created), the
    trainer ranks set up on the address trainer rank 0 picked on
    its own node (``rendezvous["trainer"]``), then the weight-sync group formed, its master again trainer rank 0
    (``rendezvous["sync"]``): with W trainer ranks and E engines of tensor parallel N, ``1 + E x N`` ranks.

    When any of that raises (a role's constructor or ``setup`` fails, a deadline passes, a group does not fit),
    :meth:`shutdown` runs before the error propagates: no actor, placement group or role thread outlives a
    failed start. Errors: :class:`RoleError`, or what a role's start raised."""

    def __init__(self, recipe: Recipe, model_dir: str, run_dir: Path, executor: Any | None = None,
                 trainer_cls: type | None = None):
        """``trainer_cls``: the trainer ranks' class (None: :class:`rlvr.train.policy.PolicyWorker`; ``rlvr serve``
        passes its subclass with the Tinker API's split update)."""
        r = recipe
        self.recipe = r
        self.trainer_cls = trainer_cls
        env = role_env(r, run_dir, r.rollout.threads)
        self.ex = executor if executor is not None else default_executor(r, run_dir)
        self.reward: Handle | None = None  # set once spawned: what shutdown() closes
        self.turns: Any = None  # rlvr.envs.rollout.TurnRollouts with an environment (multi-turn), set in _start
        self.step = 0  # the step the loop is on (named in timeout errors); set by train()
        try:
            self._start(model_dir, env)
        except BaseException:  # a role that fails to start: stop every role, group and thread started so far
            self.shutdown()
            raise

    def _start(self, model_dir: str, env: dict[str, str]) -> None:
        """Reserve the placement groups, spawn every role, set up the trainer ranks and form the weight-sync
        group (the class docstring); ``__init__`` shuts down what this started when it raises."""
        from rlvr.reward.pool import RewardWorker

        r = self.recipe
        self.model_dir, self.env, self.version, self.restarts = model_dir, env, 0, 0
        # the policy version the trainer holds once its submitted calls have run (the controller sets it when it
        # submits an update; ahead of ``version``, the engines', while an update runs beside generation)
        self.trainer_version = 0
        self.res = role_resources(r, env)
        if r.environment.enabled or r.tools.enabled:  # the turn loop's thread and environment workers, in this process
            from rlvr.envs.rollout import TurnRollouts

            self.turns = TurnRollouts(r.environment, r.data, r.rollout.max_new_tokens, model_dir, r.tools,
                                      r.reward.verifiers)
        self.ex.reserve(placement_groups(self.res), r.timeouts.startup_s, "timeouts.startup_s")
        self.rendezvous: dict[str, tuple[str, int]] = {}
        # the vLLM roles first (in one process, the local executor, the trainer's thread count is then set last);
        # on a shared GPU each one's start (it measures the free memory) is finished before the next role is created
        ordered = shares_devices(r)
        self.engines: list[Handle] = []
        for i in range(r.rollout.num_engines):
            self.engines.append(self._spawn_engine(i))
            if ordered:
                self._started(self.engines[-1])
        self.judge: Handle | None = self._spawn_judge() if uses_judge(r) else None
        if ordered and self.judge is not None:
            self._started(self.judge)
        self.teacher: Handle | None = self._spawn_teacher() if uses_teacher(r) else None
        if ordered and self.teacher is not None:
            self._started(self.teacher)
        self.reward = self.ex.spawn(
            "reward",
            RewardWorker,
            rule_specs(r.reward.verifiers),  # the judge verifiers are asked of the judge role instead
            r.reward.num_workers,
            r.reward.timeout_s,
            r.reward.memory_mb,
            resources=self.res["reward"][0],
        )
        setups = self._spawn_trainers(model_dir)
        from rlvr.sync.probe import PROBE_NEW_TOKENS, probe_prompt

        # the fixed prompt of the sync probe (rlvr.sync.probe), as long as the engines' context allows; built once
        self.probe_ids = probe_prompt(model_dir, r.max_sequence_tokens - PROBE_NEW_TOKENS)
        self.get(setups + [h.call("ping") for h in self.all], r.timeouts.startup_s, "starting the roles",
                 "timeouts.startup_s")
        where = self.ex.node_ips(self.all, r.timeouts.startup_s)
        log.info("roles placed: %s", ", ".join(f"{h.name} on {ip}" for h, ip in zip(self.all, where)))
        self._init_sync()

    def _spawn_trainers(self, model_dir: str) -> list:
        """Spawn the trainer ranks and the critic (if any); returns the ranks' ``setup`` calls. Two phases: the
        ranks start empty, rank 0 picks the data-parallel group's address on its own node, then every rank loads
        its model and joins the group there."""
        from rlvr.train.policy import PolicyWorker

        r = self.recipe
        cls = self.trainer_cls or PolicyWorker
        self.trainers: list[Handle] = [
            self.ex.spawn(f"trainer{k}", cls, r, model_dir, k, r.trainer.num_workers, resources=self.res["trainer"][k])
            for k in range(r.trainer.num_workers)
        ]
        self.rendezvous["trainer"] = self._rank0_address("the trainer's data-parallel group")
        setups = [t.call("setup", *self.rendezvous["trainer"]) for t in self.trainers]
        self.critic: Handle | None = None
        if uses_critic(r):
            from rlvr.train.critic import CriticWorker

            self.critic = self.ex.spawn("critic", CriticWorker, r, model_dir, resources=self.res["critic"][0])
        return setups

    def rebuild_trainers(self) -> None:
        """Replace the trainer group after one of its processes died (issue 41): every trainer rank and the critic
        are killed (the survivors' data-parallel group is broken) and started anew, each from the model folder
        (policy version 0; the caller loads a checkpoint), in a new data-parallel group, and a new weight-sync group
        is formed with the engines, which live on (with the weights they held: the caller pushes the ones it
        resumes from). Errors: :class:`RoleError` when the new ranks do not start within ``timeouts.startup_s``."""
        t0 = time.perf_counter()
        for h in self.trainers + ([self.critic] if self.critic is not None else []):
            self.ex.kill(h)
        setups = self._spawn_trainers(self.model_dir)
        fresh = self.trainers + ([self.critic] if self.critic is not None else [])
        self.get(setups + [h.call("ping") for h in fresh], self.recipe.timeouts.startup_s,
                 "starting the new trainer group", "timeouts.startup_s")
        self._init_sync()
        self.trainer_version = 0
        log.warning("trainer group rebuilt in %.1fs (%d ranks%s); the engines, reward worker and other roles kept",
                    time.perf_counter() - t0, len(self.trainers), " and the critic" if self.critic else "")

    def _started(self, role: Handle) -> None:
        """Wait until ``role`` is built (its constructor ran: a vLLM engine has sized its KV cache), within
        ``timeouts.startup_s``: the start-up order on a shared GPU (:func:`shares_devices`)."""
        self.get([role.call("ping")], self.recipe.timeouts.startup_s, f"starting {role.name} before the roles after "
                 "it (they share a GPU: vLLM sizes its KV cache from the free memory it measures)", "timeouts.startup_s")

    def _rank0_address(self, what: str) -> tuple[str, int]:
        """(node IP, free port) chosen inside trainer rank 0's process, on its node: the master of ``what``."""
        host, port = self.get([self.trainers[0].call("rendezvous_address")], self.recipe.timeouts.startup_s,
                              f"asking trainer rank 0 for an address for {what}", "timeouts.startup_s")[0]
        log.info("%s: master at %s:%d (trainer rank 0's node)", what, host, port)
        return str(host), int(port)

    @property
    def all(self) -> list[Handle]:
        """Every role: the engines, the judge and the teacher (if any), the reward worker, the trainer ranks and the
        critic (if any)."""
        return (self.engines + ([self.judge] if self.judge else []) + ([self.teacher] if self.teacher else [])
                + [self.reward] + self.trainers
                + ([self.critic] if self.critic else []))  # fmt: skip

    def _spawn_judge(self) -> Handle:
        """The judge role (:class:`rlvr.reward.judge.JudgeWorker`) on ``judge.model``, resolved as ``model.path``
        is; its own placement group, outside the weight-sync group."""
        from rlvr.models import resolve_model
        from rlvr.reward.judge import JudgeWorker

        jg = self.recipe.judge
        return self.ex.spawn("judge", JudgeWorker, resolve_model(str(jg.model)), dtype=jg.dtype,
                             max_model_len=jg.max_model_len, seed=engine_seed(self.recipe.run.seed, 0),
                             kv_cache_gib=jg.kv_cache_gib, gpu_memory_utilization=jg.gpu_memory_utilization,
                             enforce_eager=jg.enforce_eager, threads=jg.threads, resources=self.res["judge"][0])  # fmt: skip

    def _spawn_teacher(self) -> Handle:
        """The teacher role (:class:`rlvr.rollout.teacher.TeacherWorker`) on ``teacher.model``, resolved as
        ``model.path`` is, its context the student's longest sequence; its own placement group, outside the
        weight-sync group (on-policy distillation, :mod:`rlvr.algos.distill`)."""
        from rlvr.models import resolve_model
        from rlvr.rollout.teacher import TeacherWorker

        r, tc = self.recipe, self.recipe.teacher
        return self.ex.spawn("teacher", TeacherWorker, resolve_model(str(tc.model)), dtype=tc.dtype,
                             max_model_len=r.max_sequence_tokens, seed=engine_seed(r.run.seed, 0),
                             kv_cache_gib=tc.kv_cache_gib, gpu_memory_utilization=tc.gpu_memory_utilization,
                             enforce_eager=tc.enforce_eager, threads=tc.threads, resources=self.res["teacher"][0])  # fmt: skip

    def _spawn_engine(self, i: int) -> Handle:
        r = self.recipe
        return self.ex.spawn(
            f"engine{i}",
            engine_class(r.rollout.engine),
            self.model_dir,
            dtype=r.model.dtype,
            max_model_len=r.max_sequence_tokens,
            seed=engine_seed(r.run.seed, i),
            kv_cache_gib=r.rollout.kv_cache_gib,
            gpu_memory_utilization=r.rollout.gpu_memory_utilization,
            enforce_eager=r.rollout.enforce_eager,
            threads=r.rollout.threads,
            **({"cpus": tuple(r.rollout.cpus)} if r.rollout.cpus else {}),
            **({"tensor_parallel_size": r.rollout.tensor_parallel_size} if r.rollout.tensor_parallel_size > 1 else {}),
            **({"lora_rank": r.trainer.lora.rank, "lora_slots": r.rollout.max_staleness + 1} if r.trainer.lora.adapter_sync else {}),
            **({"in_flight": True, "in_flight_kv": r.rollout.in_flight_kv} if r.rollout.in_flight_updates else {}),
            resources=self.res["engines"][i],
        )

    def restart_dead_engines(self, known_dead: tuple[int, ...] = ()) -> list[int]:
        """Replace the engines ``known_dead`` and every other engine whose process is gone (a ping fails; a busy
        engine answers once its current rollout ends), form a new weight-sync group with all engines and push the
        current weights (policy version ``self.version``). Returns the replaced engines' indices.
        Errors: :class:`RoleError` when a replacement does not start (or the executor cannot restart roles)."""
        dead = self._replace_engines(known_dead)
        self.sync(max(self.version, self.trainer_version))
        return dead

    def _replace_engines(self, known_dead: tuple[int, ...]) -> list[int]:
        """:meth:`restart_dead_engines` up to the new weight-sync group (the weights not yet pushed)."""
        dead = list(known_dead)
        # the new group needs trainer rank 0 free to join it: under asynchronous rollout it may be mid-update (its
        # queued calls run first; the weights it then sends are those of trainer_version)
        self.get([t.call("ping") for t in self.trainers], self.recipe.timeouts.train_s,
                 "waiting for the trainer to re-sync a replaced engine", "timeouts.train_s")
        for i, e in enumerate(self.engines):
            if i in dead:
                continue
            try:
                self.get([e.call("ping")], self.recipe.timeouts.rollout_s, f"checking engine{i}", "timeouts.rollout_s")
            except RoleError as err:
                if not err.died:
                    raise
                dead.append(i)
        for i in dead:
            self.ex.kill(self.engines[i])
            self.engines[i] = self._spawn_engine(i)
        self.get([self.engines[i].call("ping") for i in dead], self.recipe.timeouts.startup_s, "restarting engines",
                 "timeouts.startup_s")
        self._init_sync()
        return dead

    def _dead_in_sync(self, send: list, recv: list, timeout_s: float) -> list[int]:
        """After a failed transfer: wait for every side of it to end (each within ``timeout_s``: the group's own
        deadline, ``sync.timeout_s``, ends a rank left waiting on a dead peer) and return the engines whose
        process died (empty: the failure was something else)."""
        dead = []
        for j, c in enumerate([*send, *recv]):
            try:
                self.ex.get([c], timeout_s, "settling a failed weight sync")
            except RoleError as err:
                if j >= len(send) and err.died:
                    dead.append(j - len(send))
        return dead

    def get(self, calls: list, timeout_s: float, what: str, setting: str | None = None) -> list:
        """Wait for ``calls`` (at most ``timeout_s`` seconds in all); errors name the step, the role and ``setting``,
        the recipe key of the deadline. Errors: :class:`RoleError`."""
        return self.ex.get(calls, timeout_s, self.what(what), setting)

    def as_completed(self, calls: list, timeout_s: float, what: str, setting: str | None = None):
        """Yield ``(position in calls, result)`` as ``calls`` finish (first finished first), all within
        ``timeout_s`` seconds; errors as :meth:`get`'s."""
        return self.ex.as_completed(calls, timeout_s, self.what(what), setting)

    def what(self, what: str) -> str:
        """``what`` a wait is for, as errors name it: prefixed with the step the loop is on (once it runs)."""
        return f"step {self.step}: {what}" if self.step else what

    def _init_sync(self) -> None:
        r = self.recipe
        self.specs = self.get([self.trainers[0].call("weight_specs")], r.timeouts.startup_s, "reading the trainer's weights",
                              "timeouts.startup_s")[0]
        self.wspecs = [WeightSpec(n, tuple(s), d) for n, s, d in self.specs]  # typed once, for every check
        # trainer.lora.sync=adapter: the adapters travel (PEFT names; vLLM checks them against the model when it
        # adds each version), with the PEFT config the engines write beside them
        self.adapter_config: str | None = None
        if r.trainer.lora.adapter_sync:
            self.adapter_config = self.get([self.trainers[0].call("adapter_config")], r.timeouts.startup_s,
                                           "reading the trainer's adapter config", "timeouts.startup_s")[0]
        else:
            expected = self.get([e.call("expected_weights") for e in self.engines], r.timeouts.startup_s,
                                "reading the engines' weights", "timeouts.startup_s")
            for i, exp in enumerate(expected):
                check_specs(self.wspecs, exp, f"engine{i}")
        backend = r.sync.backend
        if backend == "auto":
            # NCCL needs each rank on its own GPU: whole GPUs on both sides; a shared GPU (fractions) or CPU: gloo
            # (the local executor holds both in one process, on one GPU: gloo)
            whole = r.trainer.num_gpus >= 1 and r.rollout.num_gpus >= 1 and r.run.executor != "local"
            backend = "nccl" if whole else "gloo"
        # group rank 0: trainer rank 0 (the sender, the TCPStore master, on its node); then each engine's workers
        tp = r.rollout.tensor_parallel_size
        host, port = self.rendezvous["sync"] = self._rank0_address("the weight-sync group")
        world = 1 + len(self.engines) * tp
        name = f"rlvr-sync-{port}"
        calls = [t.call("init_weight_sync", host, port, world, backend, r.sync.timeout_s, name) for t in self.trainers]
        calls += [
            e.call("init_weight_sync", host, port, 1 + i * tp, world, backend, r.sync.timeout_s, name)
            for i, e in enumerate(self.engines)
        ]
        self.get(calls, r.sync.timeout_s + 30, "forming the weight-sync group")
        self.sync_backend = backend
        self.sync_bytes = float(sum(s.nbytes for s in self.wspecs))

    def sync(self, version: int) -> dict[str, float]:
        """Push the trainer's weights to every engine; check checksums and what each engine worker loaded
        (``sync.check``: :func:`rlvr.sync.readback.check_loaded`), and on every ``sync.probe_every``-th version
        what the engines compute (:func:`rlvr.sync.probe.run_probe`: ``sync/probe_gap_*``, nats); return ``sync/*``
        metrics. An engine whose process dies during the transfer is replaced and the sync redone, with every
        engine (``sync/redone``; the restarts count against ``rollout.max_restarts``). Errors:
        :class:`WeightSyncError` on a failed transfer, a checksum, read-back or probe mismatch."""
        r = self.recipe
        t0 = time.perf_counter()
        if self.adapter_config is not None:  # trainer.lora.sync=adapter: a versioned LoRA on every engine
            recv = [e.call("receive_adapter", self.specs, version, r.sync.bucket_mb, self.adapter_config)
                    for e in self.engines]  # fmt: skip
        else:
            recv = [e.call("receive_weights", self.specs, version, r.sync.bucket_mb) for e in self.engines]
        send = [t.call("send_weights", r.sync.bucket_mb, r.sync.check) for t in self.trainers]
        try:
            sent = self.get(send, r.sync.timeout_s + 30, f"weight sync to policy version {version}")[0]
            got = self.get(recv, r.sync.timeout_s + 30, f"weight sync to policy version {version}")
        except RoleError as e:
            dead = self._dead_in_sync(send, recv, r.sync.timeout_s + 30)
            if not dead or self.restarts >= r.rollout.max_restarts:
                raise WeightSyncError(f"{e}. The run stops: an engine with unknown weights cannot be trusted"
                                      + (f" (engines {dead} died; rollout.max_restarts={r.rollout.max_restarts} "
                                         "spent)" if dead else "") + ".") from e  # fmt: skip
            self.restarts += 1  # an engine died mid-sync: replace it, form the group anew, send everything again
            log.warning("%s; engines %s died during the sync: replacing them (restart %d of at most %d) and "
                        "syncing again", e, dead, self.restarts, r.rollout.max_restarts)
            self._replace_engines(tuple(dead))
            redone = self.sync(version)
            return {**redone, mn.SYNC_SECONDS: time.perf_counter() - t0, mn.SYNC_REDONE: 1.0 + redone[mn.SYNC_REDONE]}
        seconds = time.perf_counter() - t0
        self.worker_checksums = [c if isinstance(c, (list, tuple)) else [c] for c in got]  # [engine][worker]
        if r.sync.check:
            for i, c in enumerate(got):  # one checksum per engine worker (a tensor-parallel engine has several)
                for j, cj in enumerate(self.worker_checksums[i]):
                    if not checksums_match(cj, sent["checksum"]):
                        raise WeightSyncError(
                            f"weight sync to engine{i} (worker {j}): checksum {cj!r} != trainer's "
                            f"{sent['checksum']!r} (corrupted transfer)"
                        )
        if r.sync.check and self.adapter_config is None:
            # what each engine worker loaded, read back exactly (rlvr.sync.readback): the probe cannot see a skipped
            # reload in bf16. (Adapters: vLLM keeps them packed per layer in its LoRA manager; the checksums and
            # the probe check them, and the engine checks that vLLM lists the version it added.)
            names, dtype = [s.name for s in self.wspecs], self.wspecs[0].dtype
            loaded = self.get([e.call("loaded_blocks", names, dtype) for e in self.engines], r.sync.timeout_s + 30,
                              f"reading back the weights of policy version {version}", "sync.timeout_s")
            for i, workers in enumerate(loaded):
                check_loaded(sent["samples"], workers, self.wspecs, f"engine{i} (policy version {version})")
        probe: dict[str, float] = {}
        if r.sync.probe_every > 0 and version % r.sync.probe_every == 0:
            from rlvr.sync.probe import run_probe, tolerance as probe_tolerance

            wait = lambda calls, timeout_s, what: self.get(calls, timeout_s, what, "sync.timeout_s")  # noqa: E731
            probe = run_probe(wait, self.engines, self.trainers, self.probe_ids, version=version,
                              tol=probe_tolerance(r.model.dtype, r.sync.probe_tolerance), dtype=r.model.dtype,
                              timeout_s=r.sync.timeout_s + 30)
        gb = sent["bytes"] / 1e9
        self.version = version
        self.trainer_version = max(self.trainer_version, version)
        return {
            mn.SYNC_SECONDS: seconds,
            mn.SYNC_SEND_SECONDS: sent["seconds"],
            mn.SYNC_GB: gb,
            mn.SYNC_GBPS: gb / max(sent["seconds"], 1e-9),
            mn.SYNC_POLICY_VERSION: float(version),
            mn.SYNC_REDONE: 0.0,
            **probe,
        }

    def reference_logprobs(self, batch: Any) -> Any:
        """The reference model's logprobs [B, S-1] (nats, rollout temperature) of ``batch``, a
        :class:`~rlvr.train.batch.TrainBatch` of B sequences: every rank computes its 1/W of the rows and all-gathers
        (:meth:`rlvr.train.policy.PolicyWorker.compute_logprobs`); rank 0's answer is returned."""
        calls = [t.call("compute_logprobs", batch, True) for t in self.trainers]
        return self.get(calls, self.recipe.timeouts.train_s, "reference logprobs", "timeouts.train_s")[0]

    def teacher_logprobs(self, batch: Any) -> Any:
        """The teacher's logprobs [B, S-1] (nats, the teacher's own distribution at temperature 1) of every token
        of ``batch`` (a ``TrainBatch``), aligned like :meth:`reference_logprobs` (0 on padding): one batched call on
        the teacher role (:mod:`rlvr.rollout.teacher`), within ``timeouts.train_s``."""
        from rlvr.rollout.teacher import align, teacher_sequences

        scored = self.get([self.teacher.call("score", teacher_sequences(batch))], self.recipe.timeouts.train_s,
                          f"the teacher's logprobs of {len(batch)} sequences", "timeouts.train_s")[0]  # fmt: skip
        return align(batch, scored)

    def critic_values(self, batch: Any) -> Any:
        """The critic's values [B, S-1] (reward units; 0 off the response) of ``batch`` (a ``TrainBatch``)."""
        return self.get([self.critic.call("compute_values", batch)], self.recipe.timeouts.train_s, "critic values",
                        "timeouts.train_s")[0]

    def shutdown(self) -> None:
        """Close the reward pool (when the reward role was spawned) and the environment workers, and stop every
        role through the executor (actors killed, placement groups removed, role threads stopped). Safe on a partly
        started ``Roles``; never raises (a failure is logged)."""
        if self.turns is not None:
            try:
                self.turns.close()
            except Exception as e:  # noqa: BLE001 - shutting down
                log.debug("closing the environment pool: %s", e)
        if self.reward is not None:
            try:
                self.get([self.reward.call("close")], self.recipe.timeouts.reward_s, "closing the reward pool",
                         "timeouts.reward_s")
            except Exception as e:  # noqa: BLE001 - shutting down: the executor stops the role anyway
                log.debug("closing the reward pool: %s", e)
        try:
            self.ex.shutdown()
        except Exception as e:  # noqa: BLE001 - never hide the error that led here
            log.warning("stopping the roles: %s: %s", type(e).__name__, e)
