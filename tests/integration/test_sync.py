"""Weight sync over a standalone gloo group: exact transfer, checksums, and loud failures instead of hangs."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlvr.hardware import free_port
from rlvr.sync.weights import (
    WeightSender,
    WeightSpec,
    WeightSyncError,
    check_specs,
    checksums_match,
    create_group,
    receive_into,
    spec_of,
)

pytestmark = pytest.mark.integration


def _tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(50, 16, generator=g).to(torch.bfloat16)),
        ("model.norm.weight", torch.randn(16, generator=g).to(torch.bfloat16)),
        ("lm_head.weight", torch.randn(50, 16, generator=g).to(torch.bfloat16)),
    ]


def test_gloo_sync_moves_exact_tensors_and_checksums_agree():
    port, named = free_port(), _tensors()
    specs = [spec_of(n, t) for n, t in named]
    got: dict = {}

    def engine():
        pg = create_group(host="127.0.0.1", port=port, rank=1, world_size=2, backend="gloo", timeout_s=30, name="t")
        got["named"], got["checksum"] = receive_into(pg, specs, torch.device("cpu"), 30)

    th = threading.Thread(target=engine)
    th.start()
    sender = WeightSender(host="127.0.0.1", port=port, world_size=2, backend="gloo", timeout_s=30, name="t")
    sent = sender.send(iter(named))
    th.join(30)
    assert sent["bytes"] == (50 * 16 + 16 + 50 * 16) * 2  # 1616 bf16 elements, 2 bytes each
    for (n, t), (m, u) in zip(named, got["named"]):
        assert n == m and u.dtype == torch.bfloat16 and torch.equal(t, u)
    assert checksums_match(sent["checksum"], got["checksum"])
    # a swapped pair of tensors changes the checksum (position-weighted terms)
    swapped = [got["named"][1], got["named"][0], got["named"][2]]
    from rlvr.sync.weights import _checksum_term

    assert not checksums_match(sum(_checksum_term(i, t) for i, (_, t) in enumerate(swapped)), sent["checksum"])


def test_engine_that_stops_receiving_midway_fails_the_sender_within_the_timeout():
    """The engine takes the first tensor and then goes silent: the sender raises WeightSyncError, no hang."""
    port, named = free_port(), _tensors()
    specs = [spec_of(n, t) for n, t in named]

    def engine():
        pg = create_group(host="127.0.0.1", port=port, rank=1, world_size=2, backend="gloo", timeout_s=4, name="t")
        receive_into(pg, specs[:1], torch.device("cpu"), 4)
        time.sleep(8)  # stays alive but never joins the next broadcast

    th = threading.Thread(target=engine, daemon=True)
    th.start()
    sender = WeightSender(host="127.0.0.1", port=port, world_size=2, backend="gloo", timeout_s=4, name="t")
    t0 = time.perf_counter()
    with pytest.raises(WeightSyncError, match="timed out|failed"):
        sender.send(iter(named))
    assert time.perf_counter() - t0 < 20


def test_mismatched_specs_are_refused_before_anything_moves():
    sent = [WeightSpec("model.norm.weight", (16,), "bfloat16"), WeightSpec("lm_head.weight", (50, 16), "bfloat16")]
    with pytest.raises(WeightSyncError, match="lm_head.weight: not in the engine's checkpoint"):
        check_specs(sent, {"model.norm.weight": (16,)}, "engine0")
    with pytest.raises(WeightSyncError, match=r"trainer shape \(16,\) != engine shape \(32,\)"):
        check_specs(sent[:1], {"model.norm.weight": (32,)}, "engine0")
