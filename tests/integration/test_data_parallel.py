"""The data-parallel trainer: W = 2 DeepSpeed ranks (gloo, one process each) take the same update as W = 1 on the
same batch (fp32), under ZeRO-2 and ZeRO-3, and each rank computes the old and reference logprobs of its own
rows only (half the forward work each), all-gathered so that every rank trains on the whole batch's values.

The batch: 8 sequences of varied lengths, advantages of both signs; mini-batches of 4 and two epochs (4 optimizer
steps) so the old logprobs are recomputed (sharded) rather than taken from the step's own forward, and the second
epoch's permutation hands each rank rows the other computed; the KL to the reference in the loss, so reference
logprobs are sharded too. The logprobs alone are also checked on 7 rows (not a multiple of W: rank 1 pads).

"The same update" is checked where a scale shows: the gradient norm before clipping (``train/grad_norm``; AdamW's
weights alone would not see a W = 2 gradient that forgot its ``* world_size``, Adam being invariant to a constant
gradient scale), the loss, and the weights. The per-token ``train/*`` statistics are token means over every rank's
tokens: each is worked out here from the per-token values the W = 1 run's loss saw (recorded in the child by
wrapping ``micro_batch_loss``), and both runs must report it; the length-sorted dealing gives rank 0 the longer
sequence of each pair, so the ranks hold different token counts and a mean of per-rank means is off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HERE = Path(__file__).resolve().parent
TINY = str(HERE.parents[1] / "recipes" / "tiny_test.yaml")
# B = 8 rows from 2 prompts x 4 samples (the recipe's batch size); the batch handed over has 8 rows; mini-batch 4:
# two optimizer steps; ppo_epochs 2 permutes the rows between epochs (every rank then needs rows it did not compute)
COMMON = ["rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "trainer.mini_batch_size=4",
          "trainer.micro_batch_size=1", "algorithm.ppo_epochs=2", "trainer.lr=1e-3", "model.dtype=float32",
          "algorithm.kl_coef=0.1", "algorithm.kl_penalty=loss", "trainer.backend=deepspeed"]  # fmt: skip


def _batch():
    from rlvr.train.batch import pack
    from rlvr.types import Completion

    g = torch.Generator().manual_seed(1)
    comps = [Completion(prompt_index=j // 4, sample_index=j % 4, prompt_ids=[1, 10 + j // 4, 11],
                        token_ids=torch.randint(4, 50, (3 + j % 4,), generator=g).tolist(), logprobs=[-3.9] * (3 + j % 4),
                        text="", finish_reason="length", policy_version=0) for j in range(8)]  # fmt: skip
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.25, -0.75, 1.5, -1.0])
    return pack(comps, adv, 0, 8)


def _rank_main(stage: int, rank: int, world: int, port: int, out: str, extra: tuple[str, ...] = ()) -> None:
    """Child process: one rank of ``world``; trains one step and writes its stats, logprob rows and weights."""
    torch.set_num_threads(1)
    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe
    from rlvr.train.policy import PolicyWorker

    import rlvr.train.policy as policy

    seen: list[dict[str, torch.Tensor]] = []  # per micro-batch: the mask and every per-token value the loss saw
    real = policy.micro_batch_loss

    def spy(cfg, logprobs, old_logprobs, advantages, mask, **kw):
        res = real(cfg, logprobs, old_logprobs, advantages, mask, **kw)
        per_token = {k: v for k, v in res.stats.items() if torch.is_tensor(v) and v.dim() > 0}
        seen.append({k: v.detach().float().cpu() for k, v in
                     {"mask": mask, "entropy": kw["entropy"], **per_token}.items()})  # fmt: skip
        return res

    policy.micro_batch_loss = spy
    r = load_recipe(TINY, COMMON + [f"trainer.zero_stage={stage}", f"trainer.num_workers={world}", *extra])
    w = policy.PolicyWorker(r, resolve_model("tiny-random"), rank, world, "127.0.0.1", port)
    batch = _batch()
    old = w.compute_logprobs(batch.select(list(range(7))))  # the all-gathered [7, S-1] every rank returns
    w.logprob_rows = 0
    stats = w.train_step(batch)
    weights = {n: t.clone() for n, t in w._named_weights()}  # every rank joins each ZeRO-3 gather
    torch.save({"weights": weights, "old": old, "seen": seen} if rank == 0 else {"seen": seen}, out + ".pt")
    Path(out).write_text(json.dumps({"stats": stats, "rows": w.logprob_rows}))


def _run(stage: int, world: int, tmp: Path, extra: tuple[str, ...] = ()) -> list[dict]:
    from rlvr.hardware import free_port

    port = free_port()
    code = "import sys; sys.path.insert(0, {here!r}); import test_data_parallel as t; t._rank_main({a})"
    outs = [str(tmp / f"s{stage}_w{world}_r{r}.json") for r in range(world)]
    procs = [subprocess.Popen([sys.executable, "-c", code.format(here=str(HERE), a=f"{stage}, {r}, {world}, {port}, {outs[r]!r}, {extra!r}")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]  # fmt: skip
    try:
        logs = [p.communicate(timeout=400)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * world, "\n".join(x[-3000:] for x in logs)
    res = [json.loads(Path(o).read_text()) for o in outs]
    for r, o in zip(res, outs):
        r.update(torch.load(o + ".pt"))
    return res


# the per-token statistics of this recipe (ppo_clip, KL in the loss, engine logprobs given, no TIS)
TOKEN_STATS = ("entropy", "kl", "clipped", "clipped_high", "clipped_low", "clipped_dual", "ratio", "approx_kl",
               "rollout_gap_abs", "rollout_kl_k3")  # fmt: skip


def _token_means(seen: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Each statistic summed over every response token of every micro-batch, over the number of those tokens."""
    n = sum(float(s["mask"].sum()) for s in seen)
    return {f"train/{k}": sum(float((s[k] * s["mask"]).sum()) for s in seen) / n for k in TOKEN_STATS}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_take_the_same_update_as_one(stage, tmp_path):
    one = _run(stage, 1, tmp_path)
    two = _run(stage, 2, tmp_path)
    # 7 rows' logprobs: rank 0 of two returns all of them (4 computed by it, 3 by rank 1), equal to one rank's
    assert float((two[0]["old"] - one[0]["old"]).abs().max()) < 1e-6
    # train_step's forwards without gradient: the old logprobs (policy) and the reference's, B rows each at W = 1;
    # ceil(B / W) = 4 each per rank at W = 2
    assert one[0]["rows"] == 16 and [r["rows"] for r in two] == [8, 8]
    s1, s2 = one[0]["stats"], two[0]["stats"]
    assert two[1]["stats"] == s2  # every rank returns the combined statistics
    # scale-sensitive: the gradient before clipping (mean over the 4 optimizer steps) and the loss
    assert s1["train/grad_norm"] > 1e-3
    assert s2["train/grad_norm"] == pytest.approx(s1["train/grad_norm"], rel=1e-4), (s1, s2)
    assert s2["train/loss"] == pytest.approx(s1["train/loss"], abs=1e-5)
    # token means over all ranks' tokens, worked out from the W = 1 run's per-token values
    tokens = [sum(int(s["mask"].sum()) for s in r["seen"]) for r in two]
    assert sum(tokens) == sum(int(s["mask"].sum()) for s in one[0]["seen"]) and tokens[0] != tokens[1], tokens
    expect = _token_means(one[0]["seen"])
    assert expect["train/entropy"] > 1.0 and expect["train/kl"] > 0.0  # not a vacuous zero
    for k, v in expect.items():
        assert s1[k] == pytest.approx(v, rel=1e-6, abs=1e-9), (k, s1[k], v)
        assert s2[k] == pytest.approx(v, rel=1e-4, abs=1e-7), (k, s2[k], v)
    w1, w2 = one[0]["weights"], two[0]["weights"]
    assert set(w1) == set(w2)
    start = {n: t for n, t in _start_weights().items()}
    moved = max(float((w1[n] - start[n]).abs().max()) for n in w1)
    assert moved > 1e-3  # 4 Adam steps of lr 1e-3 moved the weights
    gap = max(float((w1[n] - w2[n]).abs().max()) for n in w1)
    assert gap < 1e-5, gap


def _start_weights() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from rlvr.models import resolve_model

    out = {}
    for f in sorted(Path(resolve_model("tiny-random")).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.timeout(900)
def test_two_lora_ranks_take_the_same_update_as_one(tmp_path):
    """trainer.lora (issue 28) at ZeRO-2: W = 2 equals W = 1 in the gradient norm, the loss and the merged weights
    (both ranks start from the same adapters: their init is drawn from run.seed, not the rank's seed); the
    reference logprobs (adapters off) are sharded as the policy's; only the targeted modules move."""
    lora = ("trainer.lora.rank=4", "trainer.lora.alpha=8", "trainer.lora.target_modules=[q_proj, up_proj]")
    one = _run(2, 1, tmp_path, lora)
    two = _run(2, 2, tmp_path, lora)
    assert one[0]["rows"] == 16 and [r["rows"] for r in two] == [8, 8]
    s1, s2 = one[0]["stats"], two[0]["stats"]
    assert s1["train/grad_norm"] > 1e-4 and s1["train/kl"] > 0.0
    assert s2["train/grad_norm"] == pytest.approx(s1["train/grad_norm"], rel=1e-4), (s1, s2)
    assert s2["train/loss"] == pytest.approx(s1["train/loss"], abs=1e-5)
    assert s2["train/kl"] == pytest.approx(s1["train/kl"], rel=1e-4, abs=1e-9)
    w1, w2, start = one[0]["weights"], two[0]["weights"], _start_weights()
    assert set(w1) == set(w2) == set(start)  # merged: the checkpoint's names
    moved = sorted(n for n in w1 if not torch.equal(w1[n], start[n]))
    assert moved == sorted(f"model.layers.{i}.{m}.weight" for i in (0, 1) for m in ("self_attn.q_proj", "mlp.up_proj"))
    assert max(float((w1[n] - w2[n]).abs().max()) for n in w1) < 1e-6


@pytest.mark.timeout(900)
def test_token_budget_ranks_take_the_same_update_as_one(tmp_path):
    """trainer.max_tokens_per_micro_batch under ZeRO-3 (issue 40): W = 2 ranks dealt by tokens, packed, with a
    16-token budget (sequences of 6-9 tokens: a rank holding 8 + 7 fills one micro-batch where 9 + 6 takes two,
    and the rank with fewer runs a forward and backward of 0 beside the other's), against W = 1 by one row at a
    time: the same gradient norm, loss and weights."""
    one = _run(3, 1, tmp_path)
    two = _run(3, 2, tmp_path, ("trainer.max_tokens_per_micro_batch=16", "trainer.packing=true"))
    s1, s2 = one[0]["stats"], two[0]["stats"]
    assert s1["train/grad_norm"] > 1e-3
    assert s2["train/grad_norm"] == pytest.approx(s1["train/grad_norm"], rel=1e-4), (s1, s2)
    assert s2["train/loss"] == pytest.approx(s1["train/loss"], abs=1e-5)
    calls = [len(r["seen"]) for r in two]  # micro-batches with a loss, per rank: 8 sequences x 2 epochs in all
    assert sum(calls) < 16 and calls[0] != calls[1], calls
    w1, w2 = one[0]["weights"], two[0]["weights"]
    gap = max(float((w1[n] - w2[n]).abs().max()) for n in w1)
    assert gap < 1e-5, gap
