"""ZeRO-3 with the DPH-RL term on two DeepSpeed ranks (gloo, one process each): a DPH batch of one sample gives
rank 1 no share. ZeRO-3 gathers parameters collectively in every forward and backward, so a rank that skipped
the DPH forward left rank 0 waiting in a gather forever (issue 9, item 10). Both ranks must finish, agree on the
weights, and take the same update as one torch rank on the whole batch (the stand-in forward of the rank with no
share has weight 0 and adds nothing)."""

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
COMMON = ["rollout.prompts_per_step=1", "trainer.lr=1e-3", "model.dtype=float32", "algorithm.dph_divergence=forward_kl",
          "algorithm.dph_coef=1.0", "trainer.micro_batch_size=2"]  # fmt: skip
WATCHED = ("lm_head.weight", "model.layers.1.mlp.down_proj.weight")


def _batches():
    """The rollout batch: 4 sequences with advantages [1, -1, 0.5, -0.5]; the DPH batch: 1 sequence whose stored
    pi_ref logprobs (-3.0 per token) differ from the policy's (~-3.9), so its term has a real gradient."""
    from rlvr.train.batch import pack
    from rlvr.types import Completion

    g = torch.Generator().manual_seed(0)

    def comp(j: int, lp: float) -> Completion:
        return Completion(prompt_index=0, sample_index=j, prompt_ids=[1, 10, 11, 12],
                          token_ids=torch.randint(4, 50, (5,), generator=g).tolist(), logprobs=[lp] * 5, text="",
                          finish_reason="length", policy_version=0)  # fmt: skip

    batch = pack([comp(j, -3.9) for j in range(4)], torch.tensor([1.0, -1.0, 0.5, -0.5]), 0, 8)
    dph = pack([comp(9, -3.0)], torch.zeros(1), 0, 8)
    return batch, dph


def _train(overrides: list[str], rank: int, world: int, port: int) -> dict:
    from rlvr.recipe import load_recipe
    from rlvr.models import resolve_model
    from rlvr.train.policy import PolicyWorker

    w = PolicyWorker(load_recipe(TINY, COMMON + overrides), resolve_model("tiny-random"), rank, world, "127.0.0.1", port)
    batch, dph = _batches()
    stats = w.train_step(batch, dph=dph)
    weights = {n: t.double() for n, t in w._named_weights()}  # every rank joins each ZeRO-3 gather
    return {"stats": stats, "checksum": sum(float(t.sum()) for t in weights.values()),
            "watched": {n: weights[n].flatten()[:64].tolist() for n in WATCHED}}


def _rank_main(rank: int, port: int, out: str) -> None:
    """Child process entry: one ZeRO-3 rank of two; writes its result as JSON to ``out``."""
    torch.set_num_threads(1)
    res = _train(["trainer.backend=deepspeed", "trainer.zero_stage=3", "trainer.num_workers=2"], rank, 2, port)
    Path(out).write_text(json.dumps(res))


@pytest.mark.timeout(420)
def test_zero3_rank_without_dph_share_does_not_hang(tmp_path):
    from rlvr.hardware import free_port

    port = free_port()
    code = "import sys; sys.path.insert(0, {here!r}); import test_zero3_dph as t; t._rank_main({rank}, {port}, {out!r})"
    procs = [subprocess.Popen([sys.executable, "-c", code.format(here=str(HERE), rank=r, port=port, out=str(tmp_path / f"r{r}.json"))],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]  # fmt: skip
    try:
        logs = [p.communicate(timeout=360)[0] for p in procs]  # the hang showed as a timeout here
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(x[-3000:] for x in logs)
    r0, r1 = (json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2))
    assert r0["checksum"] == r1["checksum"]  # one model on both ranks
    assert r0["stats"]["train/skipped"] == 0.0
    # forward KL log pi_ref - log pi per token on the DPH sample: -3.0 - (about -3.9) ~ +0.9 (pi is near uniform, ln 50 = 3.91)
    assert 0.5 < r0["stats"]["train/dph_div"] < 1.3
    one = _train(["trainer.backend=torch"], 0, 1, free_port())  # the same update on one rank, whole batches
    assert abs(one["stats"]["train/dph_div"] - r0["stats"]["train/dph_div"]) < 1e-5
    for n in WATCHED:
        a, b = torch.tensor(r0["watched"][n]), torch.tensor(one["watched"][n])
        assert float((a - b).abs().max()) < 1e-6, n  # Adam's first step moves each weight by ~lr = 1e-3
