"""A NaN gradient on a *later* step under DeepSpeed (issue 9, item 7): steps 1 and 3 are finite, step 2 has a NaN
advantage (so a NaN loss and NaN gradients). Step 2 must be skipped (``train/skipped`` 1, weights bit-identical to
after step 1) and step 3 must train again, for ZeRO-0/2/3 in fp32 and bf16. Measured before the change: ZeRO-0 in
fp32 applied the NaN step (NaN weights) and, its grad norm being None, counted every step as skipped.

Each case runs in a child process: a DeepSpeed engine in the test process would leave torch.distributed state
behind for later tests."""

from __future__ import annotations


import pytest
from in_child import call_in_child

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _three_steps(stage: int, dtype: str) -> list[dict]:
    """Steps good, NaN, good on one DeepSpeed rank; per step: skipped, grad norm, weights changed, all finite."""
    import dataclasses

    import torch

    import test_objectives_loop as t

    w = t._worker("trainer.backend=deepspeed", "trainer.lr=1e-2", f"model.dtype={dtype}", f"trainer.zero_stage={stage}")
    batch = t._batch()
    good = dataclasses.replace(batch, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]))
    bad = dataclasses.replace(batch, advantages=torch.tensor([float("nan"), 1.0, -1.0, 0.0]))
    out = []
    for b in (good, bad, good):
        before = t._params(w)
        s = w.train_step(b)
        after = t._params(w)
        out.append({"skipped": s["train/skipped"], "grad_norm": s["train/grad_norm"],
                    "changed": any(not torch.equal(before[n], x) for n, x in after.items()),
                    "finite": all(bool(torch.isfinite(x).all()) for x in after.values())})  # fmt: skip
    return out


@pytest.mark.timeout(300)
# ZeRO-0 fp32 is the case that was broken (the step applied, no norm); bf16 and fp32 each once more under ZeRO-2/3
# (test_objectives_loop covers ZeRO-2 fp32 with a NaN on the first step); the other pairs were checked by hand.
@pytest.mark.parametrize("stage, dtype", [(0, "float32"), (2, "bfloat16"), (3, "float32"), (3, "bfloat16")])  # fmt: skip
def test_nan_on_step_two_is_skipped(stage, dtype):
    s1, s2, s3 = call_in_child("test_deepspeed_nonfinite", "_three_steps", stage, dtype, timeout_s=280)
    assert (s1["skipped"], s1["changed"]) == (0.0, True)
    assert s1["grad_norm"] > 0.0  # a real, finite norm (ZeRO-0 fp32 reported None -> NaN before)
    assert (s2["skipped"], s2["changed"]) == (1.0, False)  # weights bit-identical to after step 1
    assert (s3["skipped"], s3["changed"], s3["finite"]) == (0.0, True, True)
