"""Packed weight sync (``sync.bucket_mb`` > 0) over a standalone gloo group: the same tensors and checksums as the
per-tensor path, one broadcast per bucket, and a loud failure instead of a hang when the receiver stops midway.
(The engine side runs in a thread with its own group rank, as in test_sync.py.)"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlvr.hardware import free_port
from rlvr.sync.weights import (
    IN_FLIGHT,
    WeightSender,
    WeightSyncError,
    bucket_bytes_of,
    create_group,
    plan_buckets,
    receive_into,
    spec_of,
)

pytestmark = pytest.mark.integration
BUCKET_MB = 0.0002  # 200 bytes


def _tensors() -> list[tuple[str, torch.Tensor]]:
    """bf16 and float32 tensors whose 200-byte layout has a dtype boundary, an oversize tensor alone, and more
    buckets than IN_FLIGHT (so the sender's staging buffers are reused within one sync)."""
    g = torch.Generator().manual_seed(0)
    shapes = [((5, 8), torch.bfloat16), ((16,), torch.bfloat16), ((30,), torch.bfloat16), ((20, 8), torch.bfloat16),
              ((10,), torch.bfloat16), ((40,), torch.bfloat16), ((12,), torch.float32), ((6, 2), torch.float32),
              ((70,), torch.float32), ((3,), torch.float32), ((8,), torch.bfloat16), ((0,), torch.bfloat16)]
    return [(f"w{i}", torch.randn(s, generator=g).to(d)) for i, (s, d) in enumerate(shapes)]


def test_packed_sync_moves_exact_tensors_with_the_per_tensor_checksums():
    port, named = free_port(), _tensors()
    specs = [spec_of(n, t) for n, t in named]
    plan = plan_buckets(specs, bucket_bytes_of(BUCKET_MB))
    # bytes 80 32 60 | 320 | 20 80 | 48 48 | 280 | 12 | 16 0
    assert plan == [[0, 1, 2], [3], [4, 5], [6, 7], [8], [9], [10, 11]] and len(plan) > IN_FLIGHT
    runs = [0.0, BUCKET_MB, BUCKET_MB, 0.001]  # per tensor; packed twice (staging reused across syncs); another size
    got: list = []

    def engine():
        pg = create_group(host="127.0.0.1", port=port, rank=1, world_size=2, backend="gloo", timeout_s=30, name="p")
        for mb in runs:
            got.append(receive_into(pg, specs, torch.device("cpu"), 30, mb))

    th = threading.Thread(target=engine)
    th.start()
    sender = WeightSender(host="127.0.0.1", port=port, world_size=2, backend="gloo", timeout_s=30, name="p")
    sent = [sender.send(iter(named), mb) for mb in runs]
    th.join(30)
    assert not th.is_alive() and len(got) == len(runs)
    assert [s["buckets"] for s in sent] == [len(named), len(plan), len(plan), 3]  # 1000 bytes: bf16 | float32 | bf16
    for s, (received, checksum) in zip(sent, got):
        assert s["bytes"] == sum(sp.nbytes for sp in specs)
        assert [n for n, _ in received] == [n for n, _ in named]
        for (_, t), (_, u) in zip(named, received):
            assert u.dtype == t.dtype and u.shape == t.shape and torch.equal(t, u)
        # per-tensor terms of the same values in the same order: the very same float, whichever path
        assert s["checksum"] == checksum == sent[0]["checksum"]


def test_receiver_that_stops_midway_fails_the_packed_sender_within_the_timeout():
    """The engine takes the first two buckets and goes silent: the sender raises WeightSyncError, no hang."""
    port, named = free_port(), _tensors()
    specs = [spec_of(n, t) for n, t in named]
    first = [i for b in plan_buckets(specs, bucket_bytes_of(BUCKET_MB))[:2] for i in b]

    def engine():
        pg = create_group(host="127.0.0.1", port=port, rank=1, world_size=2, backend="gloo", timeout_s=3, name="p")
        receive_into(pg, [specs[i] for i in first], torch.device("cpu"), 3, BUCKET_MB)
        time.sleep(6)  # stays alive but never joins the next broadcast

    th = threading.Thread(target=engine, daemon=True)
    th.start()
    sender = WeightSender(host="127.0.0.1", port=port, world_size=2, backend="gloo", timeout_s=3, name="p")
    t0 = time.perf_counter()
    with pytest.raises(WeightSyncError, match=r"bucket w4 \.\. w5 \(2 tensors\) (failed|timed out)"):
        sender.send(iter(named), BUCKET_MB)  # the third bucket: the first not received
    assert time.perf_counter() - t0 < 15


def test_both_sides_stream_holding_a_few_buckets_never_the_model(monkeypatch):
    """Streaming (issue 27): 24 float32 tensors of 100 bytes in 200-byte buckets (12 buckets of 2), sent from a
    generator of fresh tensors (as a ZeRO-3 gather yields them) and consumed one by one. Each tensor's memory is a
    NumPy array, so its release is seen whatever views torch makes of it. When the sender asks for the next tensor,
    at most the open bucket's one tensor and the current one are alive (packed tensors are dropped; a sender that
    keeps what it sent holds up to 23). When the receiver hands over a tensor, at most IN_FLIGHT + 1 receive
    buffers exist (the one being read and those posted; one that posts every bucket at once or keeps them: up to
    12). The values and checksums still match."""
    import weakref

    import numpy as np

    import rlvr.sync.weights as W

    def tracked(n: int, live: set) -> torch.Tensor:
        arr = np.empty(n, dtype=np.float32)
        key = object()
        live.add(key)
        weakref.finalize(arr, live.discard, key)
        return torch.from_numpy(arr)

    g = torch.Generator().manual_seed(1)
    named = [(f"w{i}", torch.randn(25, generator=g)) for i in range(24)]
    specs = [spec_of(n, t) for n, t in named]
    assert len(plan_buckets(specs, bucket_bytes_of(BUCKET_MB))) == 12
    sent_live: set = set()
    sent_alive: list[int] = []

    def fresh():
        for n, t in named:
            sent_alive.append(len(sent_live))  # tensors yielded earlier that the sender still holds
            c = tracked(25, sent_live)
            c.copy_(t)
            yield n, c
            del c

    recv_live: set = set()
    recv_alive: list[int] = []
    cpu_empty = W._empty
    monkeypatch.setattr(W, "_empty", lambda shape, dtype, device: (
        tracked(int(torch.Size(shape).numel()), recv_live).view(shape) if dtype == torch.float32
        else cpu_empty(shape, dtype, device)))
    got, seen = W.Received(), []

    def engine():
        pg = create_group(host="127.0.0.1", port=port, rank=1, world_size=2, backend="gloo", timeout_s=30, name="s")
        for n, t in W.receive_stream(pg, specs, torch.device("cpu"), 30, BUCKET_MB, got):
            recv_alive.append(len(recv_live))
            seen.append((n, t.clone()))
            del t

    port = free_port()
    th = threading.Thread(target=engine)
    th.start()
    sender = WeightSender(host="127.0.0.1", port=port, world_size=2, backend="gloo", timeout_s=30, name="s")
    sent = sender.send(fresh(), BUCKET_MB)
    th.join(30)
    assert not th.is_alive() and len(seen) == 24 and got.count == 24
    assert all(n == m and torch.equal(t, u) for (n, t), (m, u) in zip(named, seen))
    assert got.checksum == sent["checksum"]
    print("sender holds:", sent_alive, "receive buffers:", recv_alive)
    assert max(sent_alive) <= 2, sent_alive
    # the bucket being yielded and IN_FLIGHT posted ones; the one before may live on a moment in gloo's worker thread
    # (its work object drops the buffer after wait() has returned: seen once as 4 alive), never the 12 of the model
    assert max(recv_alive) <= IN_FLIGHT + 2, recv_alive
