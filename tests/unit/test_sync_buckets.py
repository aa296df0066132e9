"""The bucket layout of a packed weight sync (``sync.bucket_mb``): a pure function both sides apply."""

from __future__ import annotations

import math

import pytest

from rlvr.sync.weights import WeightSpec, bucket_bytes_of, plan_buckets


def _bf16(n: int, name: str = "t") -> WeightSpec:
    return WeightSpec(name, (n,), "bfloat16")  # 2 bytes per element


def _f32(n: int, name: str = "t") -> WeightSpec:
    return WeightSpec(name, (n,), "float32")  # 4 bytes per element


# bytes:    20         10        40 (2 x 20)       12       8
SPECS = [_bf16(10), _bf16(5), WeightSpec("m", (2, 10), "bfloat16"), _f32(3), _f32(2)]


def test_nbytes_of_the_hand_worked_specs():
    assert [s.nbytes for s in SPECS] == [20, 10, 40, 12, 8]


@pytest.mark.parametrize(
    "bucket_bytes,expected",
    [
        # 20 + 10 = 30 fits 32; 40 > 32 travels alone; float32 starts a new bucket: 12 + 8 = 20
        (32, [[0, 1], [2], [3, 4]]),
        (30, [[0, 1], [2], [3, 4]]),  # a bucket may be exactly full
        (29, [[0], [1], [2], [3, 4]]),  # 20 + 10 > 29
        (19, [[0], [1], [2], [3], [4]]),  # 20 and 40 alone (oversize); 10 + 40 > 19; 12 + 8 > 19
        (70, [[0, 1, 2], [3, 4]]),  # 20 + 10 + 40 = 70: only the dtype change splits
        (10**9, [[0, 1, 2], [3, 4]]),
        (0, [[0], [1], [2], [3], [4]]),  # 0: one tensor per broadcast (the per-tensor path)
        (-1, [[0], [1], [2], [3], [4]]),
    ],
)
def test_hand_worked_layouts(bucket_bytes, expected):
    assert plan_buckets(SPECS, bucket_bytes) == expected


def test_empty_list_has_no_buckets():
    assert plan_buckets([], 1000) == []
    assert plan_buckets([], 0) == []


def test_dtype_change_starts_a_bucket_even_when_it_would_fit_and_order_is_kept():
    specs = [_bf16(1), _f32(1), _bf16(1), _bf16(1), _f32(1)]
    assert plan_buckets(specs, 10**6) == [[0], [1], [2, 3], [4]]  # no regrouping of the two float32 tensors


def test_oversize_tensor_travels_alone_between_small_ones():
    specs = [_bf16(4), _bf16(100), _bf16(4), _bf16(4)]  # 8, 200, 8, 8 bytes
    assert plan_buckets(specs, 16) == [[0], [1], [2, 3]]
    assert plan_buckets(specs[1:], 16) == [[0], [1, 2]]  # oversize first: the next tensor opens a new bucket


def test_zero_size_tensor_joins_the_open_bucket():
    specs = [_bf16(4), _bf16(0), _bf16(4)]  # 8, 0, 8 bytes
    assert plan_buckets(specs, 8) == [[0, 1], [2]]


def test_every_index_once_in_send_order_and_within_the_limit():
    specs = [_bf16(n) for n in (7, 1, 300, 2, 2, 64, 64, 5, 0, 130)] + [_f32(n) for n in (3, 40, 1)]
    for size in (0, 1, 16, 128, 129, 256, 1000, 10**6):
        plan = plan_buckets(specs, size)
        assert [i for b in plan for i in b] == list(range(len(specs)))
        for b in plan:
            assert len({specs[i].dtype for i in b}) == 1
            assert len(b) == 1 or sum(specs[i].nbytes for i in b) <= size


def test_a_prefix_of_the_specs_plans_a_prefix_of_the_buckets():
    """Greedy in send order: the sender, which sees its tensors one at a time, makes the receivers' layout."""
    specs = [_bf16(n) for n in (7, 1, 300, 2, 2, 64, 64, 5, 0, 130)] + [_f32(n) for n in (3, 40, 1)]
    full = plan_buckets(specs, 140)
    for k in range(1, len(specs) + 1):
        part = plan_buckets(specs[:k], 140)
        assert part[:-1] == full[: len(part) - 1]  # closed buckets are final
        assert full[len(part) - 1][: len(part[-1])] == part[-1]  # the open one only grows


def test_bucket_mb_is_in_units_of_1e6_bytes():
    assert bucket_bytes_of(0) == 0
    assert bucket_bytes_of(1) == 1_000_000
    assert bucket_bytes_of(1.5) == 1_500_000
    assert bucket_bytes_of(256) == 256_000_000
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError, match="bucket_mb must be >= 0"):
            bucket_bytes_of(bad)


def test_recipe_takes_bucket_mb_and_refuses_a_negative_one():
    from pathlib import Path

    from rlvr.config import RecipeError
    from rlvr.recipe import load_recipe

    tiny = Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml"
    assert load_recipe(tiny, ["sync.bucket_mb=4"]).sync.bucket_mb == 4.0
    with pytest.raises(RecipeError, match=r"sync.bucket_mb must be >= 0 MB"):
        load_recipe(tiny, ["sync.bucket_mb=-1"])
