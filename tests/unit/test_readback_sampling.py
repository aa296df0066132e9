"""The read-back's pure parts (rlvr.sync.readback, rlvr.sync.weights): which columns are sampled, the trainer's
sample, and the controller's verdict on hand-made blocks. The real engines are in
tests/integration/test_sync_readback.py."""

from __future__ import annotations

import pytest
import torch

from rlvr.sync.readback import check_loaded, module_blocks
from rlvr.sync.weights import WeightSpec, WeightSyncError, sample_columns, trainer_sample


def _blk(name, r0, c0, c1, values):
    v = torch.as_tensor(values, dtype=torch.float32)
    return (name, r0, r0 + v.shape[0], c0, c1, "float32", v.numpy().tobytes())


def test_sample_columns_all_when_narrow_else_sixteen_evenly_spaced_from_the_names_crc():
    assert sample_columns("x", 1) == [0]
    assert sample_columns("x", 16) == list(range(16))
    # 100 columns: step 100/16 = 6.25; crc32(b"a") = 3904355907, mod int(6.25) = 6 gives offset 3;
    # columns int(3 + 6.25 j), j = 0..15
    assert sample_columns("a", 100) == [3, 9, 15, 21, 28, 34, 40, 46, 53, 59, 65, 71, 78, 84, 90, 96]


def test_trainer_sample_is_every_row_at_the_sampled_columns():
    t = torch.arange(4 * 100, dtype=torch.float32).view(4, 100)  # element (r, c) = 100 r + c
    s = trainer_sample("a", t)
    assert s.shape == (4, 16)
    assert s[2, 4].item() == 228.0  # row 2, column 28 (the fifth sampled column of "a")
    assert trainer_sample("n", torch.tensor([1.0, 2.0, 3.0])).tolist() == [[1.0], [2.0], [3.0]]  # 1-D: whole
    assert trainer_sample("e", torch.empty(0, 4)).shape == (0, 4)  # an empty tensor: an empty sample


SPECS = [WeightSpec("a", (4, 3), "float32"), WeightSpec("b", (5,), "float32")]
A = torch.arange(12, dtype=torch.float32).view(4, 3)
B = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
SAMPLES = {"a": trainer_sample("a", A), "b": trainer_sample("b", B)}


def _workers(a_top=None):
    """Two workers: a's rows 0-1 on worker 0, rows 2-3 on worker 1; both hold b (replicated)."""
    top = A[:2] if a_top is None else a_top
    return [[_blk("a", 0, 0, 3, top), _blk("b", 0, 0, 1, B[:, None])],
            [_blk("a", 2, 0, 3, A[2:]), _blk("b", 0, 0, 1, B[:, None])]]  # fmt: skip


def test_a_good_read_back_passes_with_no_element_differing():
    assert check_loaded(SAMPLES, _workers(), SPECS, "engine0") == 0.0
    # column shards (a row-parallel layer): columns 0 and 1-2 on two workers
    cols = [[_blk("a", 0, 0, 1, A[:, :1]), _blk("b", 0, 0, 1, B[:, None])], [_blk("a", 0, 1, 3, A[:, 1:])]]
    assert check_loaded(SAMPLES, cols, SPECS, "engine0") == 0.0


def test_one_differing_element_fails_and_names_the_worker_and_the_tensor():
    top = A[:2].clone()
    top[1, 2] += 1.0
    with pytest.raises(WeightSyncError, match=r"engine0: .*\(1 of 22 read-back elements, 0.0455\).*worker 0 a rows 0-2 "
                                              r"cols 0-3: 1 of 6 differ"):  # 6 + 6 + 5 + 5 elements read back
        check_loaded(SAMPLES, _workers(top), SPECS, "engine0")


def test_nan_read_back_of_a_nan_weight_is_equal_and_a_stale_nan_is_not():
    a = A.clone()
    a[0, 0] = float("nan")
    samples = {"a": trainer_sample("a", a), "b": SAMPLES["b"]}
    assert check_loaded(samples, _workers(a[:2]), SPECS, "e") == 0.0
    with pytest.raises(WeightSyncError, match="1 of 6 differ"):
        check_loaded(samples, _workers(), SPECS, "e")  # the engine kept 0.0 where the trainer has NaN


def test_a_shard_no_worker_holds_or_an_unsent_tensor_fails():
    only_top = [[_blk("a", 0, 0, 3, A[:2]), _blk("b", 0, 0, 1, B[:, None])]]
    with pytest.raises(WeightSyncError, match=r"does not cover 1 sent tensors, e.g. a \(6 of 12 elements\)"):
        check_loaded(SAMPLES, only_top, SPECS, "engine0")
    # the same rectangle from two workers (replicated kv heads) counts once
    twice = [only_top[0], [_blk("a", 0, 0, 3, A[:2])]]
    with pytest.raises(WeightSyncError, match=r"a \(6 of 12 elements\)"):
        check_loaded(SAMPLES, twice, SPECS, "engine0")
    with pytest.raises(WeightSyncError, match="read back 'c', a tensor the sync did not send"):
        check_loaded(SAMPLES, [[_blk("c", 0, 0, 1, B[:, None])]], SPECS, "engine0")


def test_module_blocks_read_every_sent_parameter_of_a_plain_module_whole():
    m = torch.nn.Linear(3, 4)
    with torch.no_grad():
        m.weight.copy_(A)
        m.bias.copy_(B[:4])
    blocks = module_blocks(m, ["weight", "bias"], torch.float32)
    assert [b[:5] for b in blocks] == [("weight", 0, 4, 0, 3), ("bias", 0, 4, 0, 1)]
    specs = [WeightSpec("weight", (4, 3), "float32"), WeightSpec("bias", (4,), "float32")]
    samples = {"weight": trainer_sample("weight", A), "bias": trainer_sample("bias", B[:4])}
    assert check_loaded(samples, [blocks], specs, "hf") == 0.0
