"""The skip decision of an optimizer step (issue 9, item 7), without starting DeepSpeed.

Under DeepSpeed the decision is the engine's ``was_step_applied()``: ``get_global_grad_norm()`` may still hold the
previous step's finite value after a skipped step (or be None), so it cannot tell. ``_FiniteAdamW`` is the
optimizer given to DeepSpeed where DeepSpeed checks nothing itself (ZeRO-0, fp32)."""

from __future__ import annotations

import math
import types

import torch

from rlvr.train.policy import PolicyWorker, _FiniteAdamW


class _Engine:
    def __init__(self, norm, applied):
        self.norm, self.applied = norm, applied

    def get_global_grad_norm(self):
        return self.norm

    def was_step_applied(self):
        return self.applied


def _ds_worker(engine):
    return types.SimpleNamespace(ds=True, engine=engine, recipe=types.SimpleNamespace(trainer=None))


def test_stale_finite_norm_after_a_skipped_step_counts_as_skipped():
    # the previous step's norm 2.5 left in place, the step not applied: skipped (the old rule said applied)
    assert PolicyWorker._optimizer_step(_ds_worker(_Engine(2.5, False))) == (2.5, False)
    assert PolicyWorker._optimizer_step(_ds_worker(_Engine(2.5, True))) == (2.5, True)


def test_missing_norm_of_an_applied_step_is_not_a_skip():
    gn, applied = PolicyWorker._optimizer_step(_ds_worker(_Engine(None, True)))
    assert math.isnan(gn) and applied  # the old rule counted it as skipped


def _param(grad):
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    p.grad = torch.tensor(grad)
    return p


def test_finite_adamw_clips_and_reports_the_norm_before_clipping():
    p = _param([3.0, 4.0])  # L2 norm 5
    opt = _FiniteAdamW([p], grad_clip=1.0, lr=0.1, weight_decay=0.0)
    opt.step()
    assert (opt.overflow, opt._global_grad_norm) == (False, 5.0)
    assert torch.allclose(p.grad, torch.tensor([0.6, 0.8]))  # clipped to norm 1
    # Adam's first step moves each weight by lr * g / |g| = 0.1 against the gradient's sign
    assert torch.allclose(p.detach(), torch.tensor([0.9, 1.9]), atol=1e-6)


def test_finite_adamw_skips_a_nan_gradient_and_leaves_no_state():
    p = _param([float("nan"), 1.0])
    opt = _FiniteAdamW([p], grad_clip=0.0, lr=0.1)
    opt.step()
    assert opt.overflow and math.isnan(opt._global_grad_norm)
    assert torch.equal(p.detach(), torch.tensor([1.0, 2.0])) and len(opt.state) == 0
