"""The policy worker's ``train/*`` per-token statistics are token means over every response token of the update,
whatever the micro-batch split (rlvr.train.policy; the same over data-parallel ranks:
tests/integration/test_data_parallel.py). Worked out here from a plain transformers forward of the starting
weights: one optimizer step (one mini-batch, one epoch), so every micro-batch's forward sees the starting weights."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.metrics import names as mn

PROMPT = [1, 4, 41, 5]
RESPONSES = [[6], [7, 8], [9, 10, 11, 12, 13]]  # 1, 2 and 5 tokens: a mean of per-sequence means is off
ROLLOUT_LP = [-3.0, -3.5, -4.0]  # the engine's logprob of every token of each sequence
TIS_CAP = 2.0


def _batch():
    from rlvr.train.batch import pack
    from rlvr.types import Completion

    comps = [Completion(prompt_index=0, sample_index=i, prompt_ids=PROMPT, token_ids=r, logprobs=[ROLLOUT_LP[i]] * len(r),
                        text="x", finish_reason="length", policy_version=0) for i, r in enumerate(RESPONSES)]  # fmt: skip
    return pack(comps, torch.tensor([1.0, -1.0, 0.5]), 0, 8)


def _by_hand(model_dir: str) -> dict[str, float]:
    """Per response token of the starting model: entropy (temperature 1), |logprob - engine logprob|, the TIS
    weight w = min(exp(logprob - engine logprob), cap) and |w - 1|; each summed over all 8 tokens, over 8; and the
    largest |w - 1| of a token."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    sums = {mn.TRAIN_ENTROPY: 0.0, mn.TRAIN_ROLLOUT_GAP_ABS: 0.0, mn.TRAIN_TIS_WEIGHT: 0.0, mn.TRAIN_TIS_WEIGHT_DEV: 0.0}
    n, dev_max = 0, 0.0
    for resp, rollout in zip(RESPONSES, ROLLOUT_LP):
        ids = torch.tensor([PROMPT + resp])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double()  # [S, V]
        for j, tok in enumerate(resp):
            z = logits[len(PROMPT) - 1 + j]  # the position that predicts response token j
            logp = z - torch.logsumexp(z, 0)
            sums[mn.TRAIN_ENTROPY] += float(-(logp.exp() * logp).sum())
            gap = float(logp[tok]) - rollout
            w = min(math.exp(gap), TIS_CAP)
            sums[mn.TRAIN_ROLLOUT_GAP_ABS] += abs(gap)
            sums[mn.TRAIN_TIS_WEIGHT] += w
            sums[mn.TRAIN_TIS_WEIGHT_DEV] += abs(w - 1.0)
            dev_max = max(dev_max, abs(w - 1.0))
            n += 1
    assert n == 8
    return {**{k: v / n for k, v in sums.items()}, mn.TRAIN_TIS_WEIGHT_DEV_MAX: dev_max}


@pytest.mark.parametrize("micro", [1, 3])
def test_train_statistics_are_token_means_over_the_whole_batch(micro):
    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe
    from rlvr.train.policy import PolicyWorker
    from test_loop_order import TINY

    model_dir = resolve_model("tiny-random")
    r = load_recipe(TINY, ["run.executor=local", "rollout.prompts_per_step=1", "rollout.samples_per_prompt=3",
                           f"trainer.micro_batch_size={micro}", "trainer.backend=torch", "model.dtype=float32",
                           f"algorithm.tis_cap={TIS_CAP}", "rollout.temperature=1.0"])  # fmt: skip
    stats = PolicyWorker(r, model_dir, 0, 1, "127.0.0.1", 0).train_step(_batch())
    expect = _by_hand(model_dir)
    assert 0.0 < expect[mn.TRAIN_TIS_WEIGHT_DEV] and expect[mn.TRAIN_ENTROPY] > 1.0  # not a vacuous zero
    for k, v in expect.items():
        assert stats[k] == pytest.approx(v, rel=1e-5), (k, stats[k], v)


def test_the_catalogue_says_which_train_statistics_are_token_means_over_all_ranks():
    said = {e.pattern for e in mn.CATALOGUE if "token mean over all ranks" in e.meaning}
    assert said == set(mn.TRAIN_TOKEN_MEANS)
    assert {mn.TRAIN_ENTROPY, mn.TRAIN_KL, mn.TRAIN_CLIPPED, mn.TRAIN_TIS_WEIGHT_DEV} <= said
    assert not said & {mn.TRAIN_LOSS, mn.TRAIN_GRAD_NORM, mn.TRAIN_TIS_WEIGHT_MAX, mn.TRAIN_TIS_WEIGHT_DEV_MAX}
