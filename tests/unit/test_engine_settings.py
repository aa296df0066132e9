"""The process environment around roles built in this process (issue 23): rlvr's engine settings reach vLLM as
engine arguments or only during the engine's construction, what roles leave in ``os.environ`` is undone when the
local executor shuts down, and a new raylet gets the environment without it. vLLM itself is faked here (its
``LLM`` records the environment it was built in); tests/integration/test_engine_env.py builds real engines."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from rlvr.config import RecipeError
from rlvr.environ import clean_env, recording_env, restore_env, scoped_env
from rlvr.recipe import load_recipe
from rlvr.runtime.executors import LocalExecutor, Resources

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
GIB = 1 << 30


# -- scoped and recorded changes ---------------------------------------------------------------------------------
def test_scoped_env_restores_its_keys_whatever_the_body_did(monkeypatch):
    monkeypatch.setenv("A_SET", "old")
    monkeypatch.setenv("A_GONE", "was here")
    monkeypatch.delenv("A_NEW", raising=False)
    monkeypatch.delenv("A_OTHER", raising=False)
    with scoped_env({"A_SET": "new", "A_NEW": "1"}, unset=["A_GONE"]):
        assert (os.environ["A_SET"], os.environ["A_NEW"], "A_GONE" in os.environ) == ("new", "1", False)
        os.environ["A_SET"] = "changed by the body"
        os.environ["A_OTHER"] = "x"  # not one of the scope's keys: stays
    assert os.environ["A_SET"] == "old" and os.environ["A_GONE"] == "was here" and "A_NEW" not in os.environ
    assert os.environ.pop("A_OTHER") == "x"


def test_clean_env_undoes_recorded_changes_and_drops_dist_variables(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/user/lib.so")
    monkeypatch.setenv("RANK", "3")  # torch.distributed's: never for a raylet, recorded or not
    for k in ("MASTER_ADDR", "VLLM_CPU_OMP_THREADS_BIND", "USER_SETTING"):
        monkeypatch.delenv(k, raising=False)
    mine: dict = {}
    with recording_env(mine):  # what a CPU engine's start and a trainer rank write
        os.environ["LD_PRELOAD"] = "/user/lib.so:/torch/libgomp.so"
        os.environ["MASTER_ADDR"] = "127.0.0.2"
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    os.environ["USER_SETTING"] = "1"  # after the roles: the user's, kept
    assert mine == {"LD_PRELOAD": "/user/lib.so", "MASTER_ADDR": None, "VLLM_CPU_OMP_THREADS_BIND": None}
    env = clean_env()
    assert env["LD_PRELOAD"] == "/user/lib.so" and env["USER_SETTING"] == "1"
    assert not {"MASTER_ADDR", "VLLM_CPU_OMP_THREADS_BIND", "RANK"} & set(env)
    assert os.environ["MASTER_ADDR"] == "127.0.0.2"  # clean_env copies; this process is unchanged
    restore_env(mine)
    assert os.environ["LD_PRELOAD"] == "/user/lib.so" and "MASTER_ADDR" not in os.environ
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ


class _LeakyRole:
    """Writes into os.environ as a vLLM engine's start (LD_PRELOAD, LOCAL_WORLD_SIZE) and a trainer rank's
    set-up (MASTER_ADDR, RANK) do."""

    def __init__(self) -> None:
        os.environ["LD_PRELOAD"] = os.environ.get("LD_PRELOAD", "") + ":/torch/libgomp.so"
        os.environ["LOCAL_WORLD_SIZE"] = "1"

    def setup(self) -> bool:
        os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0")
        return True

    def env(self, key: str) -> str | None:
        return os.environ.get(key)


def test_local_executor_gives_the_environment_back_at_shutdown(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/user/lib.so")
    monkeypatch.setenv("ROLE_SHARED", "the user's")
    for k in ("LOCAL_WORLD_SIZE", "MASTER_ADDR", "RANK", "ROLE_ONLY"):
        monkeypatch.delenv(k, raising=False)
    before = dict(os.environ)
    ex = LocalExecutor()
    h = ex.spawn("engine0", _LeakyRole, resources=Resources(env={"ROLE_ONLY": "1", "ROLE_SHARED": "the role's"}))
    assert ex.get([h.call("setup")], 30, "setup") == [True]
    # while the roles run, they see their settings (the user's value of a shared one wins, as before)
    assert ex.get([h.call("env", "ROLE_ONLY"), h.call("env", "ROLE_SHARED")], 30, "env") == ["1", "the user's"]
    assert os.environ["MASTER_ADDR"] == "127.0.0.1" and os.environ["LD_PRELOAD"] == "/user/lib.so:/torch/libgomp.so"
    ex.shutdown()
    assert dict(os.environ) == before


# -- the engine's settings reach vLLM explicitly ----------------------------------------------------------------
class _FakeLLM:
    """Stands for vllm.LLM: records its arguments and the environment it is built in, and writes into
    os.environ as vLLM's CPU platform does."""

    built: list[tuple[dict, dict]] = []

    def __init__(self, **kwargs) -> None:
        _FakeLLM.built.append((kwargs, dict(os.environ)))
        os.environ["LOCAL_WORLD_SIZE"] = str(kwargs["tensor_parallel_size"])


@pytest.fixture
def fake_vllm(monkeypatch):
    """A ``vllm`` module whose ``LLM`` is :class:`_FakeLLM`; torch threads and CUDA left alone."""
    import torch

    envs = types.SimpleNamespace(disable_envs_cache=lambda: None)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=_FakeLLM, envs=envs))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr("rlvr.rollout.vllm_engine._on_gpu", lambda: False)
    _FakeLLM.built.clear()
    # what a run or an earlier test left in this process: under the old setdefault these won over the recipe
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return _FakeLLM.built


def test_the_engine_passes_its_kv_cache_and_scopes_what_vllm_reads_from_the_environment(fake_vllm):
    from rlvr.rollout.vllm_engine import VLLMEngine

    before = dict(os.environ)
    VLLMEngine("/m", dtype="float32", max_model_len=64, kv_cache_gib=2.5, threads=1, tensor_parallel_size=2,
               cpus=(0, 1))  # fmt: skip
    ((kwargs, during),) = fake_vllm
    assert kwargs["kv_cache_memory_bytes"] == 2.5 * GIB == 2684354560  # 2.5 x 1024^3, not rounded to 2 or 3 GiB
    # while vLLM starts (and its tensor-parallel workers inherit): this engine's settings, not what was there
    assert "VLLM_CPU_KVCACHE_SPACE" not in during  # it would override kv_cache_memory_bytes
    assert during["VLLM_CPU_OMP_THREADS_BIND"] == "0|1" and during["OMP_NUM_THREADS"] == "1"
    assert during["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    # afterwards: the process's environment as it was, apart from what vLLM wrote itself (recorded for clean_env)
    after = dict(os.environ)
    assert after.pop("LOCAL_WORLD_SIZE") == "2" and after == before
    assert "LOCAL_WORLD_SIZE" not in clean_env()
    restore_env({"LOCAL_WORLD_SIZE": None})


def test_a_judge_built_after_the_rollout_engine_gets_its_own_kv_cache(fake_vllm):
    """The local executor builds the rollout engine, then the judge, in one process: before, the first engine's
    ``VLLM_CPU_KVCACHE_SPACE`` stayed in the environment and the judge's setdefault kept it (1 GiB for 3)."""
    from rlvr.reward.judge import JudgeWorker
    from rlvr.rollout.vllm_engine import VLLMEngine

    os.environ.pop("VLLM_CPU_KVCACHE_SPACE")
    VLLMEngine("/m", dtype="float32", max_model_len=64, kv_cache_gib=1.0, threads=1)
    with pytest.raises(Exception):  # no tokenizer at /m: the engine is built before it
        JudgeWorker("/m", dtype="float32", max_model_len=64, kv_cache_gib=3.0, threads=1)
    (engine, _), (judge, during) = fake_vllm
    assert (engine["kv_cache_memory_bytes"], judge["kv_cache_memory_bytes"]) == (1 * GIB, 3 * GIB)
    assert during["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"  # one worker, unbound
    restore_env({"LOCAL_WORLD_SIZE": None})


# -- the recipe refuses tensor parallel without the probe ---------------------------------------------------------
def test_tensor_parallel_without_the_probe_is_refused_naming_both_keys_and_the_fix():
    with pytest.raises(RecipeError) as e:
        load_recipe(TINY, ["rollout.tensor_parallel_size=2", "sync.probe_every=0", "sync.check=false"])
    msg = str(e.value)
    assert "rollout.tensor_parallel_size=2 with sync.check=false and sync.probe_every=0" in msg
    assert "set sync.check=true" in msg and "sync.probe_every >= 1" in msg and "or rollout.tensor_parallel_size=1" in msg
    # either check alone sees each worker's shard: accepted (the read-back by default, or a probe every 3rd sync)
    assert load_recipe(TINY, ["rollout.tensor_parallel_size=2", "sync.probe_every=0"]).sync.check
    assert load_recipe(TINY, ["rollout.tensor_parallel_size=2", "sync.probe_every=3", "sync.check=false"]).sync.probe_every == 3
    assert load_recipe(TINY, ["sync.probe_every=0"]).rollout.tensor_parallel_size == 1


def test_a_kv_cache_of_zero_is_refused_at_load():
    with pytest.raises(RecipeError, match=r"rollout\.kv_cache_gib=0\.0 must be > 0 GiB"):
        load_recipe(TINY, ["rollout.kv_cache_gib=0"])


def test_reward_resources_reach_the_reward_bundle():
    """What pins the reward role in the two-node test (tests/integration/test_scale_out.py)."""
    from rlvr.runtime.roles import role_resources

    res = role_resources(load_recipe(TINY, ["reward.resources={head_node: 1}"]), {})
    assert res["reward"][0].bundle_dict() == {"CPU": 0.1, "head_node": 1}
