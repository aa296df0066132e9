"""A rollout engine and a judge built in one process by the local executor, as a run with ``run.executor=local``
and a judge verifier builds them (real vLLM, tiny model, fp32): each gets its own KV cache, and the process's
environment is as before once the executor shuts down (issue 23: the first engine's ``VLLM_CPU_KVCACHE_SPACE``
stayed in the environment, the judge's setdefault kept it, and every later ``ray start`` inherited it with
vLLM's and torch.distributed's variables)."""

from __future__ import annotations

import os

import pytest

from in_child import call_in_child

pytestmark = pytest.mark.integration


def _engine_and_judge(engine_gib: float, judge_gib: float) -> dict:
    """In a fresh process: KV cache tokens of each engine (vLLM's blocks x block size) and the variables whose
    value differs after the executor's shutdown from before its first spawn."""
    from rlvr.models import resolve_model
    from rlvr.reward.judge import JudgeWorker
    from rlvr.rollout.vllm_engine import VLLMEngine
    from rlvr.runtime.executors import LocalExecutor, Resources

    model = resolve_model("tiny-random")
    before = dict(os.environ)
    ex = LocalExecutor()
    # the roles' environment as role_env gives it, with the variable a user's shell (or the old rlvr) might set
    env = Resources(env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": "1"})
    engine = ex.spawn("engine0", VLLMEngine, model, dtype="float32", max_model_len=128, kv_cache_gib=engine_gib,
                      threads=1, resources=env)  # fmt: skip
    judge = ex.spawn("judge", JudgeWorker, model, dtype="float32", max_model_len=128, kv_cache_gib=judge_gib, threads=1,
                     resources=env)  # fmt: skip
    ex.get([engine.call("ping"), judge.call("ping")], 600, "starting the engines")
    tokens = {}
    for name, h in (("engine", engine), ("judge", judge)):
        obj = h._target[1].result()
        cache = (obj.engine if name == "judge" else obj).llm.llm_engine.vllm_config.cache_config
        tokens[name] = cache.num_gpu_blocks * cache.block_size
    ex.shutdown()
    left = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
    return {"tokens": tokens, "left": left}


def test_the_judge_gets_its_own_kv_cache_and_the_environment_is_given_back():
    out = call_in_child("test_engine_env", "_engine_and_judge", 1.0, 3.0, timeout_s=900)
    # tiny-random in fp32: K and V x 2 layers x 2 KV heads x 64 dims x 4 bytes = 2048 bytes per token, so
    # 1 GiB holds 2^30 / 2^11 = 524288 tokens and 3 GiB 1572864 (before: the judge got the engine's 1 GiB)
    assert out["tokens"] == {"engine": 524288, "judge": 1572864}, out
    assert out["left"] == [], out  # before: 21 variables, vLLM's LD_PRELOAD and VLLM_CPU_OMP_THREADS_BIND among them
