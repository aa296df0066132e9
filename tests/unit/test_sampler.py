"""PromptSampler: seeded epoch orders, batches across epoch boundaries, exact resume (case C1)."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.data import PromptSampler


def _perm(n: int, seed: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def test_deterministic_and_seeded():
    a, b, c = PromptSampler(50, 7, seed=1, shuffle=True), PromptSampler(50, 7, 1), PromptSampler(50, 7, 2)
    seq_a = [a.next_batch() for _ in range(20)]
    assert seq_a == [b.next_batch() for _ in range(20)]
    assert seq_a != [c.next_batch() for _ in range(20)]


def test_epoch_orders_are_seed_plus_epoch_permutations():
    s = PromptSampler(12, 4, seed=10)
    flat = [i for _ in range(6) for i in s.next_batch()]  # 24 items = 2 epochs
    assert flat[:12] == _perm(12, 10)
    assert flat[12:] == _perm(12, 11)
    assert sorted(flat[:12]) == list(range(12)) and sorted(flat[12:]) == list(range(12))
    assert s.epoch == 2


def test_batch_crosses_epoch_boundary():
    s = PromptSampler(10, 4, seed=0)
    e0, e1 = _perm(10, 0), _perm(10, 1)
    assert s.next_batch() == e0[0:4]
    assert s.next_batch() == e0[4:8]
    assert s.epoch == 0
    assert s.next_batch() == e0[8:10] + e1[0:2]
    assert s.epoch == 1 and s.state_dict() == {"epoch": 1, "offset": 2, "seed": 0}


def test_no_shuffle_by_hand():
    s = PromptSampler(5, 3, seed=0, shuffle=False)
    assert [s.next_batch() for _ in range(4)] == [[0, 1, 2], [3, 4, 0], [1, 2, 3], [4, 0, 1]]
    assert s.state_dict() == {"epoch": 2, "offset": 2, "seed": 0}


@pytest.mark.parametrize("stop", [60, 37])
def test_resume_equals_uninterrupted_c1(stop):
    # C1: 60 batches an epoch (240 prompts, 4 a batch), 2 epochs; stop at batch `stop`, resume, same batches
    full = PromptSampler(240, 4, seed=7)
    uninterrupted = [full.next_batch() for _ in range(120)]
    first = PromptSampler(240, 4, seed=7)
    for _ in range(stop):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    if stop == 60:
        assert state == {"epoch": 1, "offset": 0, "seed": 7}
    resumed = PromptSampler(240, 4, seed=999)  # the saved seed wins
    resumed.load_state_dict(state)
    assert resumed.epoch == state["epoch"]
    rest = [resumed.next_batch() for _ in range(120 - stop)]
    assert len(rest) == 120 - stop
    assert rest == uninterrupted[stop:]
    assert resumed.epoch == 2


def test_batch_larger_than_data_is_an_error():
    with pytest.raises(ValueError, match=r"rollout.prompts_per_step <= 5"):
        PromptSampler(5, 6, seed=0)
    with pytest.raises(ValueError, match="num_items=0"):
        PromptSampler(0, 1, seed=0)


def test_state_that_does_not_fit_is_an_error():
    s = PromptSampler(5, 2, seed=0)
    with pytest.raises(ValueError, match="does not fit 5 prompts"):
        s.load_state_dict({"epoch": 0, "offset": 7, "seed": 0})
    with pytest.raises(ValueError, match=r"lacks \['seed'\]"):
        s.load_state_dict({"epoch": 0, "offset": 1})
