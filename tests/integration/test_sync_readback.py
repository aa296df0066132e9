"""What the engine loaded, read back (issue 23, "The sync check in bf16"): a sync whose reload loads nothing, or only
half the tensors, fails at that sync in bf16 as in fp32, while the probe's bf16 tolerance lets both through.

The real vLLM engine (CPU, in-process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on ``tiny-random``; the faults are
injected by replacing the worker extension's ``rlvr_receive`` (as ``test_sync_engine.py`` does), which leaves the
separate read-back call (``rlvr_readback``) to check what was loaded. The trainer's change between syncs is a step
the size of an lr-1e-5 update: N(0, 1e-5^2) added to every weight of std 0.02, which moves only the few percent of
bf16 elements that cross a rounding boundary (the case the bf16 probe cannot see).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from rlvr.models import resolve_model
from rlvr.recipe import load_recipe
from rlvr.sync.probe import run_probe, tolerance
from rlvr.sync.weights import WeightSpec, WeightSyncError, receive_into

pytestmark = pytest.mark.integration
TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml")
STEP = 1e-5  # std of the trainer's change between syncs: an lr-1e-5 step's size


def _roles(tmp_path, *overrides: str):
    from rlvr.runtime.executors import LocalExecutor
    from rlvr.runtime.roles import Roles

    recipe = load_recipe(TINY, [f"run.output_dir={tmp_path}", "run.executor=local", "trainer.backend=torch", *overrides])
    return Roles(recipe, resolve_model("tiny-random"), tmp_path, LocalExecutor())


def _trainer(roles) -> torch.nn.Module:
    return roles.trainers[0]._target[1].result().module  # the object behind a LocalExecutor handle (tests only)


def _step(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * STEP)


def _probe_mean(roles) -> float:
    return run_probe(roles.get, roles.engines, roles.trainers, roles.probe_ids, tol=float("inf"), version=roles.version,
                     dtype=roles.recipe.model.dtype, timeout_s=120)["sync/probe_gap_mean"]


def _reload_only(keep):
    """An ``rlvr_receive`` that receives every tensor (the transfer checksum agrees) and reloads those ``keep``
    selects from the list of (index, name)."""

    def receive(self, specs, bucket_mb=0.0):
        ws = [WeightSpec(n, tuple(s), d) for n, s, d in specs]
        named, total = receive_into(self._rlvr_pg, ws, torch.device("cpu"), self._rlvr_timeout, bucket_mb)
        dtype = next(self.model_runner.get_model().parameters()).dtype
        kept = [(n, t.to(dtype)) for i, (n, t) in enumerate(named) if keep(i, n)]
        if kept:
            self.reload_weights(weights_iterator=kept, is_checkpoint_format=True)
        return total

    return receive


def _fraction(err: pytest.ExceptionInfo) -> float:
    """The share of read-back elements that differ, as the error states it ("(d of n read-back elements, f)")."""
    d, n = re.search(r"\((\d+) of (\d+) read-back elements", str(err.value)).groups()
    return int(d) / int(n)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_readback_stops_a_reload_that_loads_nothing_or_half(tmp_path, monkeypatch, dtype):
    """Good sync: passes (0 elements differ). No-op reload, then half the tensors (every other one in send order)
    skipped: WeightSyncError at that very sync, with the probe off (``sync.probe_every=0``) so the read-back alone
    decides. In bf16 the probe's mean gap after the no-op is printed beside its 0.1 tolerance. A good sync after the
    faults passes again (the check judges the sync, not the engine's history)."""
    import rlvr.sync.vllm_ext as ext

    roles = _roles(tmp_path, f"model.dtype={dtype}", "sync.probe_every=0")
    try:
        trainer = _trainer(roles)
        _step(trainer, seed=1)
        t0 = time.perf_counter()
        good = roles.sync(version=1)
        sync_s = time.perf_counter() - t0
        good_probe = _probe_mean(roles)

        real = ext.WeightSyncExtension.rlvr_receive
        monkeypatch.setattr(ext.WeightSyncExtension, "rlvr_receive", _reload_only(lambda i, n: False))
        _step(trainer, seed=2)
        with pytest.raises(WeightSyncError, match=r"engine0 \(policy version 2\): the engine's loaded weights differ") as noop:
            roles.sync(version=2)
        noop_probe = _probe_mean(roles)

        monkeypatch.setattr(ext.WeightSyncExtension, "rlvr_receive", _reload_only(lambda i, n: i % 2 == 0))
        _step(trainer, seed=3)
        with pytest.raises(WeightSyncError, match=r"engine0 \(policy version 3\): the engine's loaded weights differ") as half:
            roles.sync(version=3)

        # measured (this CPU): no-op 19% of the sampled bf16 elements differ (all in fp32), half 39% (48%)
        assert _fraction(noop) > 0.05 and _fraction(half) > 0.05
        if dtype == "bfloat16":  # the probe alone would have let the no-op through (measured 0.0011 = the good sync's)
            assert noop_probe < tolerance(dtype, None)

        monkeypatch.setattr(ext.WeightSyncExtension, "rlvr_receive", real)
        _step(trainer, seed=4)
        again = roles.sync(version=4)
        print(f"{dtype}: good sync {sync_s:.2f}s (transfer {good['sync/seconds']:.3f}s), probe mean after good "
              f"{good_probe:.3g}, after no-op {noop_probe:.3g}; no-op: {_fraction(noop):.3g}, half skipped: {_fraction(half):.3g} of read-back "
              f"elements differ; good again: policy {again['sync/policy_version']}")
    finally:
        roles.shutdown()


SHARDED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "o_proj", "down_proj")


def _tp_weights(model_dir: str) -> list[tuple[str, torch.Tensor]]:
    """The weights the tensor-parallel test sends: the checkpoint plus N(0, 0.01^2) (seeded), in bf16."""
    from safetensors.torch import load_file

    gen = torch.Generator().manual_seed(5)
    return [(n, (t + torch.randn(t.shape, generator=gen) * 0.01).to(torch.bfloat16))
            for n, t in load_file(f"{model_dir}/model.safetensors").items()]  # fmt: skip


def _swap_to_rank0_shards(self, model_dir: str) -> bool:
    """Runs in each worker of a tensor-parallel engine (``collective_rpc``, forked workers): worker 1 reloads the
    sent weights with its shard of every sharded projection replaced by worker 0's (the rows of q/k/v/gate/up, the
    columns of o/down): "a worker that loads the wrong shard". Worker 0 does nothing."""
    if int(getattr(self, "rank", 0)) != 1:
        return False
    named = []
    for n, t in _tp_weights(model_dir):
        if any(k in n for k in SHARDED[:5]):
            t = torch.cat([t[: t.shape[0] // 2]] * 2)
        elif any(k in n for k in SHARDED[5:]):
            t = torch.cat([t[:, : t.shape[1] // 2]] * 2, dim=1)
        named.append((n, t))
    self.reload_weights(weights_iterator=named, is_checkpoint_format=True)
    return True


@pytest.fixture(scope="module")
def qwen_tiny(tmp_path_factory) -> str:
    """A tiny Qwen2: biases on q/k/v, tied embeddings, 2 query heads and ONE kv head (so with tensor parallel 2
    both workers hold the whole k and v: vLLM replicates kv heads it cannot split)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr.models import tiny

    folder = tmp_path_factory.mktemp("qwen_tiny")
    cfg = Qwen2Config(vocab_size=50, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True)
    cfg.architectures = ["Qwen2ForCausalLM"]
    model = tiny.init_weights(Qwen2ForCausalLM(cfg))  # tiny-random's init, this architecture
    model.save_pretrained(folder, safe_serialization=True)
    tiny.build_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_each_tensor_parallel_worker_is_checked_on_the_shard_it_loaded(arch, request):
    """A tensor-parallel engine (2 workers, bf16): each worker reads back the checkpoint rectangles of its own shard
    (q_proj rows 0-63 / 64-127 of 128, o_proj columns 0-63 / 64-127; qwen2's single kv head: k_proj rows 0-63 on
    both, with its bias), and a good sync passes. When worker 1 then
    holds worker 0's shards of the projections the read-back fails on those, in worker 1 only; the transfer checksum (one per worker, equal
    by construction: every worker receives the full tensors) cannot see this."""
    import threading

    from rlvr.rollout.vllm_engine import VLLMEngine
    from rlvr.hardware import free_port
    from rlvr.sync.readback import check_loaded
    from rlvr.sync.weights import WeightSender

    model_dir = resolve_model("tiny-random") if arch == "llama" else request.getfixturevalue("qwen_tiny")
    engine = VLLMEngine(model_dir, dtype="bfloat16", max_model_len=128, tensor_parallel_size=2)
    port = free_port()
    joined = threading.Thread(target=engine.init_weight_sync, args=("127.0.0.1", port, 1, 3, "gloo", 60, "tp"))
    joined.start()
    sender = WeightSender(host="127.0.0.1", port=port, world_size=3, backend="gloo", timeout_s=60, name="tp")
    joined.join(60)
    named = _tp_weights(model_dir)  # other than the engine's start weights
    specs = [(n, tuple(t.shape), "bfloat16") for n, t in named]
    wspecs = [WeightSpec(*s) for s in specs]
    got: dict = {}
    recv = threading.Thread(target=lambda: got.update(c=engine.receive_weights(specs, 1)))
    recv.start()
    sent = sender.send(iter(named))
    recv.join(60)
    assert len(got["c"]) == 2

    workers = engine.loaded_blocks([n for n, _ in named], "bfloat16")
    assert len(workers) == 2
    q, o = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight"
    assert [[b[1:5] for b in w if b[0] == q] for w in workers] == [[(0, 64, 0, 128)], [(64, 128, 0, 128)]]
    assert [[b[1:5] for b in w if b[0] == o] for w in workers] == [[(0, 128, 0, 64)], [(0, 128, 64, 128)]]
    if arch == "qwen2":
        k = "model.layers.0.self_attn.k_proj"
        assert [[b[1:5] for b in w if b[0] == f"{k}.weight"] for w in workers] == [[(0, 64, 0, 128)]] * 2
        assert [[b[1:5] for b in w if b[0] == f"{k}.bias"] for w in workers] == [[(0, 64, 0, 1)]] * 2
    assert check_loaded(sent["samples"], workers, wspecs, "engine0") == 0.0

    engine.llm.collective_rpc(_swap_to_rank0_shards, args=(model_dir,))
    with pytest.raises(WeightSyncError, match="worker 1 model.layers") as err:
        check_loaded(sent["samples"], engine.loaded_blocks([n for n, _ in named], "bfloat16"), wspecs, "engine0")
    print("TP wrong shard:", str(err.value)[:300])
    blocks = re.findall(r"worker (\d) (\S+) rows", str(err.value))  # the first 5 bad blocks the error lists
    assert blocks and all(j == "1" and any(k in n for k in SHARDED) for j, n in blocks), blocks
