"""Which GPU a trainer rank computes on (issue 27, rlvr.train.policy.pick_device), with torch.cuda faked: a rank
that sees several GPUs takes ``rank % visible`` and makes it its current device (``torch.cuda.set_device``), and
DeepSpeed reads the same index from ``LOCAL_RANK``. Before, the rank kept ``current_device()`` (always 0) while
``LOCAL_RANK`` said ``rank``: DeepSpeed's module on cuda:rank, the batches on cuda:0, and cuda:rank past the last GPU
for a rank >= the GPUs it sees."""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from rlvr.train import policy
from rlvr.train.policy import PolicyWorker, local_gpu, pick_device

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml"


def test_local_gpu_by_hand():
    assert local_gpu(0, 0) is None and local_gpu(3, 0) is None  # no GPU: CPU
    assert [local_gpu(k, 1) for k in range(4)] == [0, 0, 0, 0]  # Ray: each rank sees its own one GPU
    assert [local_gpu(k, 4) for k in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]  # 4 GPUs a node, ranks packed in order
    assert local_gpu(3, 2) == 1  # within the 2 it sees (the old rule said cuda:3)


class _FakeCuda:
    def __init__(self, count: int) -> None:
        self.count, self.current = count, []

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: self.count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "set_device", self.current.append)


@pytest.mark.parametrize("count, rank, index", [(4, 2, 2), (4, 5, 1), (1, 3, 0)])
def test_a_rank_takes_its_gpu_and_makes_it_current(monkeypatch, count, rank, index):
    cuda = _FakeCuda(count)
    cuda.install(monkeypatch)
    assert pick_device(rank) == (torch.device("cuda", index), index)
    assert cuda.current == [index]


def test_without_cuda_the_rank_runs_on_cpu_and_sets_no_device(monkeypatch):
    cuda = _FakeCuda(0)
    cuda.install(monkeypatch)
    assert pick_device(1) == (torch.device("cpu"), 0)
    assert cuda.current == []


def test_local_rank_is_the_index_of_the_rank_s_gpu(monkeypatch):
    """What DeepSpeed reads (LOCAL_RANK) is the GPU the rank computes on, not its global rank."""
    import torch.distributed as dist

    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.setenv(k, "unset")  # restored afterwards
    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # the group itself is not formed here
    policy._init_dist(5, 8, "10.0.0.1", 29500, "nccl", 1)
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("5", "8", "1")


class _Stop(Exception):
    pass


def test_setup_uses_the_picked_device_and_hands_its_index_to_deepspeed(monkeypatch):
    """PolicyWorker.setup asks pick_device (faked: cpu, index 3) and passes that index to _init_dist; DeepSpeed is
    faked too (the test stops where the group would be joined)."""
    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe

    asked, joined = [], []

    def fake_pick(rank):
        asked.append(rank)
        return torch.device("cpu"), 3

    def fake_init(rank, world, addr, port, backend, local_rank):
        joined.append((rank, world, backend, local_rank))
        raise _Stop

    monkeypatch.setattr(policy, "pick_device", fake_pick)
    monkeypatch.setattr(policy, "_init_dist", fake_init)
    fake_ds = types.ModuleType("deepspeed")
    fake_ds.__spec__ = importlib.machinery.ModuleSpec("deepspeed", None)
    monkeypatch.setitem(sys.modules, "deepspeed", fake_ds)
    r = load_recipe(TINY, ["trainer.backend=deepspeed", "trainer.num_workers=2"])
    worker = PolicyWorker(r, resolve_model("tiny-random"), 1, 2)
    with pytest.raises(_Stop):
        worker.setup("127.0.0.1", 0)
    assert asked == [1] and joined == [(1, 2, "gloo", 3)]
    assert (worker.device, worker.local_rank) == (torch.device("cpu"), 3)
