"""Weight sync from the trainer to the rollout engines over a torch.distributed group of its own.

The group holds trainer rank 0 (group rank 0, the sender and the ``TCPStore`` master) and one rank per engine
worker (group ranks 1..E). It is built from a public ``TCPStore`` + ``PrefixStore`` and a ``ProcessGroupGloo``
(CPU) or ``ProcessGroupNCCL`` (GPU), so it is separate from the trainer's data-parallel default group and can
include processes outside that world (``dist.new_group`` cannot).

Protocol of one sync (``version`` v):
1. The controller obtains the trainer's :class:`WeightSpec` list (names, shapes, dtypes: no tensors) and checks it
   against each engine's expected spec (:func:`check_specs`) *before* any tensor moves: a reload that fails midway
   kills a vLLM engine.
2. The trainer calls :meth:`WeightSender.send`; each engine worker calls :func:`receive_into` with the same specs;
   every tensor travels by one ``broadcast`` from rank 0 (one per parameter: on CPU this beat bucketing).
3. Both sides compute a float64 checksum of what they sent/received; the controller compares them.

Every wait has a timeout (``timeout_s``): a peer that never joins or stops mid-transfer raises
:class:`WeightSyncError` instead of hanging.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator

import torch

DTYPES: dict[str, torch.dtype] = {  # recipe dtype name -> torch dtype (model.dtype, sync specs)
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class WeightSyncError(RuntimeError):
    """A weight sync could not complete (peer missing, timeout, mismatched specs or checksums)."""


@dataclass(frozen=True)
class WeightSpec:
    """Name (Hugging Face checkpoint name), shape and dtype name of one tensor sent in a sync."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=DTYPES[self.dtype]).element_size()


def spec_of(name: str, t: torch.Tensor) -> WeightSpec:
    return WeightSpec(name, tuple(t.shape), str(t.dtype).removeprefix("torch."))


def check_specs(sent: list[WeightSpec], expected: dict[str, tuple[int, ...]], who: str) -> None:
    """Check that every sent tensor is one the engine expects, with the same shape.

    ``expected``: checkpoint name -> shape, read from the engine's model folder. Tensors the engine's checkpoint
    lacks (e.g. a tied ``lm_head.weight``) are errors, so are shape mismatches.
    Errors: :class:`WeightSyncError` listing up to 5 offending names.
    """
    bad = []
    for s in sent:
        if s.name not in expected:
            bad.append(f"{s.name}: not in the engine's checkpoint")
        elif tuple(expected[s.name]) != s.shape:
            bad.append(f"{s.name}: trainer shape {s.shape} != engine shape {tuple(expected[s.name])}")
    if bad:
        raise WeightSyncError(
            f"weight sync to {who} refused before sending: {len(bad)} mismatched tensors, e.g. "
            + "; ".join(bad[:5])
            + ". The trainer and the engine must load the same model architecture."
        )


def _timeout(seconds: float) -> timedelta:
    return timedelta(seconds=float(seconds))


def create_group(
    *, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float, name: str
) -> torch.distributed.ProcessGroup:
    """Join (rank > 0) or host (rank 0) a standalone process group; blocks until all ranks have joined.

    Errors: :class:`WeightSyncError` when the ranks do not all join within ``timeout_s`` seconds.
    """
    from torch.distributed import PrefixStore, TCPStore

    try:
        store = TCPStore(
            host, port, world_size, is_master=(rank == 0), timeout=_timeout(timeout_s), wait_for_workers=False
        )
        store = PrefixStore(name, store)
        if backend == "gloo":
            from torch.distributed import ProcessGroupGloo

            return ProcessGroupGloo(store, rank, world_size, _timeout(timeout_s))
        if backend == "nccl":
            from torch.distributed import ProcessGroupNCCL

            opts = ProcessGroupNCCL.Options()
            opts._timeout = _timeout(timeout_s)
            return ProcessGroupNCCL(store, rank, world_size, opts)
    except Exception as e:  # store/rendezvous timeouts surface as RuntimeError/DistStoreError
        raise WeightSyncError(
            f"weight-sync group {name!r} (rank {rank} of {world_size}, {backend}, {host}:{port}) could not "
            f"form within {timeout_s:.0f}s: {e}. Check that every engine started and that the port is free."
        ) from e
    raise WeightSyncError(f"unknown weight-sync backend {backend!r}: use gloo (CPU) or nccl (GPU)")


def _broadcast(pg, t: torch.Tensor, what: str, timeout_s: float) -> None:
    from torch.distributed import BroadcastOptions

    opts = BroadcastOptions()
    opts.rootRank = 0
    try:
        work = pg.broadcast([t], opts)
        work.wait(_timeout(timeout_s))
    except Exception as e:
        raise WeightSyncError(f"weight sync broadcast of {what} failed or timed out after {timeout_s:.0f}s: {e}") from e


def _checksum_term(i: int, t: torch.Tensor) -> float:
    """One tensor's share of a sync checksum: float64 sum weighted by its position (catches swaps cheaply)."""
    return float(t.detach().double().sum()) * (1.0 + (i % 7) * 1e-3)


class WeightSender:
    """Trainer side (group rank 0) of the weight-sync group."""

    def __init__(self, *, host: str, port: int, world_size: int, backend: str, timeout_s: float, name: str):
        self.timeout_s = timeout_s
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.pg = create_group(
            host=host, port=port, rank=0, world_size=world_size, backend=backend, timeout_s=timeout_s, name=name
        )

    def send(self, named: Iterator[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """Broadcast every tensor, in order. Returns ``{"bytes", "seconds", "checksum"}`` (seconds: wall time)."""
        t0 = time.perf_counter()
        nbytes, sent = 0, []
        for name, t in named:
            t = t.detach().to(self.device).contiguous()
            _broadcast(self.pg, t, name, self.timeout_s)
            nbytes += t.numel() * t.element_size()
            sent.append(t)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0  # the transfer alone; the checksum below is off the wire's clock
        total = sum(_checksum_term(i, t) for i, t in enumerate(sent))
        return {"bytes": float(nbytes), "seconds": seconds, "checksum": total}


def receive_into(pg, specs: list[WeightSpec], device: torch.device, timeout_s: float) -> tuple[list[tuple[str, torch.Tensor]], float]:
    """Engine side: receive every tensor of ``specs`` from rank 0. Returns ``(named tensors, checksum)``."""
    out = []
    for s in specs:
        t = torch.empty(s.shape, dtype=DTYPES[s.dtype], device=device)
        _broadcast(pg, t, s.name, timeout_s)
        out.append((s.name, t))
    return out, sum(_checksum_term(i, t) for i, (_, t) in enumerate(out))


def checksums_match(a: float, b: float) -> bool:
    """Equal up to float64 summation-order noise (relative 1e-9)."""
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
