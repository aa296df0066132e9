"""The data-parallel trainer: W = 2 DeepSpeed ranks (gloo, one process each) take the same update as W = 1 on the
same batch (fp32), under ZeRO-2 and ZeRO-3, and each rank computes the old and reference logprobs of its own
rows only (half the forward work each), all-gathered so that every rank trains on the whole batch's values.

The batch: 8 sequences of varied lengths, advantages of both signs; mini-batches of 4 and two epochs (4 optimizer
steps) so the old logprobs are recomputed (sharded) rather than taken from the step's own forward, and the second
epoch's permutation hands each rank rows the other computed; the KL to the reference in the loss, so reference
logprobs are sharded too. The logprobs alone are also checked on 7 rows (not a multiple of W: rank 1 pads)."""

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


def _rank_main(stage: int, rank: int, world: int, port: int, out: str) -> None:
    """Child process: one rank of ``world``; trains one step and writes its stats, logprob rows and weights."""
    torch.set_num_threads(1)
    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe
    from rlvr.train.policy import PolicyWorker

    r = load_recipe(TINY, COMMON + [f"trainer.zero_stage={stage}", f"trainer.num_workers={world}"])
    w = PolicyWorker(r, resolve_model("tiny-random"), rank, world, "127.0.0.1", port)
    batch = _batch()
    old = w.compute_logprobs(batch.select(list(range(7))))  # the all-gathered [7, S-1] every rank returns
    w.logprob_rows = 0
    stats = w.train_step(batch)
    weights = {n: t.clone() for n, t in w._named_weights()}  # every rank joins each ZeRO-3 gather
    if rank == 0:
        torch.save({"weights": weights, "old": old}, out + ".pt")
    Path(out).write_text(json.dumps({"stats": stats, "rows": w.logprob_rows}))


def _run(stage: int, world: int, tmp: Path) -> list[dict]:
    from rlvr.runtime.executors import free_port

    port = free_port()
    code = "import sys; sys.path.insert(0, {here!r}); import test_data_parallel as t; t._rank_main({a})"
    outs = [str(tmp / f"s{stage}_w{world}_r{r}.json") for r in range(world)]
    procs = [subprocess.Popen([sys.executable, "-c", code.format(here=str(HERE), a=f"{stage}, {r}, {world}, {port}, {outs[r]!r}")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]  # fmt: skip
    try:
        logs = [p.communicate(timeout=400)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * world, "\n".join(x[-3000:] for x in logs)
    res = [json.loads(Path(o).read_text()) for o in outs]
    res[0].update(torch.load(outs[0] + ".pt"))
    return res


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
    for k in ("train/loss", "train/kl", "train/clip_frac"):
        if k in one[0]["stats"]:
            assert two[0]["stats"][k] == pytest.approx(one[0]["stats"][k], abs=1e-5), k
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
