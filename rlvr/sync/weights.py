"""Weight sync from the trainer to the rollout engines over a torch.distributed group of its own.

The group holds trainer rank 0 (group rank 0, the sender and the ``TCPStore`` master) and one rank per engine
worker (group ranks 1..E). It is built from a public ``TCPStore`` + ``PrefixStore`` and a ``ProcessGroupGloo``
(CPU) or ``ProcessGroupNCCL`` (GPU), so it is separate from the trainer's data-parallel default group and can
include processes outside that world (``dist.new_group`` cannot).

Protocol of one sync (``version`` v):
1. The controller obtains the trainer's :class:`WeightSpec` list (names, shapes, dtypes: no tensors) and checks it
   against each engine's expected spec (:func:`check_specs`) *before* any tensor moves: a reload that fails midway
   kills a vLLM engine.
2. The trainer calls :meth:`WeightSender.send`; each engine worker iterates :func:`receive_stream` with the same
   specs and the same ``bucket_mb`` (``sync.bucket_mb``), loading each tensor as its bucket arrives. The tensors
   travel by ``broadcast`` from rank 0, packed in send order into flat buckets of at most ``bucket_mb`` MB
   (:func:`plan_buckets`, which both sides derive from the specs), one broadcast per bucket; ``bucket_mb = 0``: one broadcast per tensor. Two broadcasts are kept in flight
   (:data:`IN_FLIGHT`). On CPU (gloo), 16 MB buckets were 1.2-1.4x faster than one broadcast per tensor (1.4-2.0x
   than the per-tensor path with one broadcast in flight, as before packing) and 1.3-1.5x faster than a single
   broadcast of the whole model, whose fresh 0.27 GB receive buffer pays its page faults during the receive
   (``benchmarks/sync_bandwidth.py``; numbers in ``SyncConfig.bucket_mb``).
   Both sides stream: the sender drops each tensor once it is packed or sent, the engine loads each bucket while
   the next ones travel (a tensor-parallel worker keeps only its shard), so neither holds a second copy of the
   model (``benchmarks/sync_memory.py`` measures the peaks). A transfer that fails midway leaves an engine
   partly loaded: the sync raises and the run stops there, as it would have (the engine cannot serve either way).
3. Both sides compute a float64 checksum of what they sent/received, running, per tensor (the same value whatever
   the bucketing); the controller compares them.
4. Each engine worker reads back a sample of what it *loaded* and the controller compares it exactly with the
   same sample of the sent tensors (:mod:`rlvr.sync.readback`).

Every wait has a timeout (``timeout_s``): a peer that never joins or stops mid-transfer raises
:class:`WeightSyncError` instead of hanging.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator, Sequence

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


SAMPLE_COLUMNS = 16
"""Columns of each sent matrix whose every row the engines' read-back checks (:mod:`rlvr.sync.readback`)."""


def n_cols(shape: Sequence[int]) -> int:
    """Columns of a tensor seen as a matrix: [d0, prod(rest)]; a 1-D tensor is one column."""
    n = 1
    for s in shape[1:]:
        n *= int(s)
    return n


def sample_columns(name: str, cols: int) -> list[int]:
    """The sampled column indices of tensor ``name`` with ``cols`` columns: all when ``cols`` <=
    :data:`SAMPLE_COLUMNS`, else :data:`SAMPLE_COLUMNS` evenly spaced ones, offset by a CRC-32 of the name (so
    stacked tensors are not all read at the same columns). Increasing, distinct, in [0, cols)."""
    if cols <= SAMPLE_COLUMNS:
        return list(range(cols))
    step = cols / SAMPLE_COLUMNS  # > 1
    off = zlib.crc32(name.encode()) % int(step)
    return [int(off + j * step) for j in range(SAMPLE_COLUMNS)]


def trainer_sample(name: str, t: torch.Tensor) -> torch.Tensor:
    """The sample of ``t`` as sent: [rows, sampled columns] in ``t``'s dtype, on the CPU."""
    m = t.detach().reshape(t.shape[0], n_cols(t.shape)) if t.dim() else t.detach().reshape(1, 1)
    return m[:, sample_columns(name, m.shape[1])].cpu().clone()


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


def _post(pg, t: torch.Tensor, what: str, timeout_s: float):
    """Start the broadcast of ``t`` from rank 0 (asynchronous); returns the work to :func:`_wait` on."""
    from torch.distributed import BroadcastOptions

    opts = BroadcastOptions()
    opts.rootRank = 0
    try:
        return pg.broadcast([t], opts)
    except Exception as e:
        raise WeightSyncError(f"weight sync broadcast of {what} failed or timed out after {timeout_s:.0f}s: {e}") from e


def _wait(work, what: str, timeout_s: float) -> None:
    try:
        work.wait(_timeout(timeout_s))
    except Exception as e:
        raise WeightSyncError(f"weight sync broadcast of {what} failed or timed out after {timeout_s:.0f}s: {e}") from e


def _broadcast(pg, t: torch.Tensor, what: str, timeout_s: float) -> None:
    _wait(_post(pg, t, what, timeout_s), what, timeout_s)


CHECKSUM_CHUNK = 1 << 20
"""Elements per float64 partial sum of a checksum term (8 MB): a whole-tensor ``double()`` copy of Qwen2.5-0.5B's
embedding is 1.09 GB, the largest transient of a sync. Measured on CPU (151936 x 896 bf16, 1 thread): 1M-element
chunks took 39-89 ms and 0-51 MB above steady state against 566-824 ms and 1089 MB for ``t.double().sum()``;
4M and 16M chunks 570-720 ms (buffers that large come fresh from the OS each time)."""


def _checksum_term(i: int, t: torch.Tensor, buf: torch.Tensor | None = None) -> float:
    """One tensor's share of a sync checksum: float64 sum weighted by its position (catches swaps cheaply), summed
    in chunks of :data:`CHECKSUM_CHUNK` elements through ``buf`` (float64, at least that long, on ``t``'s device;
    a fresh one when None): no float64 copy of the whole tensor, and no allocation per chunk (8 MB blocks allocated
    and freed beside gloo's threads grew a sender's resident memory by ~300 MB over two syncs)."""
    flat = t.detach().reshape(-1)
    if buf is None:
        buf = torch.empty(min(CHECKSUM_CHUNK, flat.numel()), dtype=torch.float64, device=flat.device)
    acc = 0.0
    for c in flat.split(CHECKSUM_CHUNK):
        b = buf[: c.numel()]
        b.copy_(c)
        acc += float(b.sum())
    return acc * (1.0 + (i % 7) * 1e-3)


def bucket_bytes_of(bucket_mb: float) -> int:
    """``sync.bucket_mb`` in bytes (MB = 1e6 bytes, as the ``sync/gb`` metric's GB = 1e9). Errors: ValueError < 0."""
    if not bucket_mb >= 0:
        raise ValueError(f"sync.bucket_mb must be >= 0 (0: one broadcast per tensor), got {bucket_mb!r}")
    return int(bucket_mb * 1e6)


def _joins(bucket_dtype: str, bucket_nbytes: int, s: WeightSpec, bucket_bytes: int) -> bool:
    """Whether tensor ``s`` joins the open bucket (``bucket_dtype``, ``bucket_nbytes`` so far) or starts a new one:
    the one rule both sides apply, in send order (so the sender can apply it while its tensors stream in)."""
    return bucket_bytes > 0 and s.dtype == bucket_dtype and bucket_nbytes + s.nbytes <= bucket_bytes


def plan_buckets(specs: Sequence[WeightSpec], bucket_bytes: int) -> list[list[int]]:
    """The bucket layout of one sync: indices into ``specs``, in send order, grouped into buckets.

    Greedy in send order: a tensor joins the open bucket when it has the bucket's dtype and the bucket stays within
    ``bucket_bytes``; otherwise it opens a new one. So a dtype change starts a new bucket, a tensor larger than
    ``bucket_bytes`` travels alone, and ``bucket_bytes <= 0`` puts every tensor alone (the per-tensor path).
    Sender and receivers derive the same layout from the same specs and size; each bucket is one broadcast.

    Buckets are typed (one dtype each) rather than ``uint8`` byte views: every tensor of a sync has the recipe
    dtype (``PolicyWorker.weight_specs``), so in practice this costs no extra bucket; a typed buffer unpacks into
    zero-copy views with no alignment rule (a byte buffer viewed as float32 needs each offset a multiple of 4),
    and NCCL sees the real dtype.
    """
    buckets: list[list[int]] = []
    dtype, nbytes = "", 0
    for i, s in enumerate(specs):
        if buckets and _joins(dtype, nbytes, s, bucket_bytes):
            buckets[-1].append(i)
            nbytes += s.nbytes
        else:
            buckets.append([i])
            dtype, nbytes = s.dtype, s.nbytes
    return buckets


IN_FLIGHT = 2
"""Broadcasts a side keeps posted at once: the sender packs bucket k+1 while bucket k is on the wire. Measured on
CPU (``benchmarks/sync_bandwidth.py``, 3 runs, against 1 in flight): 18-28% off a per-tensor sync, 4-25% off at
16 MB (at 4 MB -4% to 14%: within this shared machine's noise). Kept small: a process group's destructor waits for
every queued broadcast, and against a stalled peer each one takes ``timeout_s`` to fail."""


class WeightSender:
    """Trainer side (group rank 0) of the weight-sync group."""

    def __init__(self, *, host: str, port: int, world_size: int, backend: str, timeout_s: float, name: str):
        self.timeout_s = timeout_s
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.pg = create_group(
            host=host, port=port, rank=0, world_size=world_size, backend=backend, timeout_s=timeout_s, name=name
        )
        # packing buffers, reused across buckets and syncs (allocated and first touched once):
        # (bucket bytes, dtype, slot) -> flat tensor; slot = bucket number % IN_FLIGHT
        self._staging: dict[tuple[int, torch.dtype, int], torch.Tensor] = {}

    def _buffer(self, bucket_bytes: int, dtype: torch.dtype, slot: int) -> torch.Tensor:
        key = (bucket_bytes, dtype, slot)
        if key not in self._staging:
            if any(k[0] != bucket_bytes for k in self._staging):
                self._staging.clear()  # another bucket size: drop the old buffers
            cap = bucket_bytes // torch.empty((), dtype=dtype).element_size()
            self._staging[key] = torch.empty(cap, dtype=dtype, device=self.device)
        return self._staging[key]

    def send(self, named: Iterator[tuple[str, torch.Tensor]], bucket_mb: float = 0.0,
             sample: bool = True) -> dict[str, float]:
        """Broadcast every tensor, in order, packed into buckets of at most ``bucket_mb`` MB (1e6 bytes; 0: one
        broadcast per tensor; layout: :func:`plan_buckets`, which the receivers apply to the same specs).

        Streaming: ``named`` is consumed one tensor at a time, and a tensor is dropped once it is packed into a
        staging buffer (or, travelling alone, once its broadcast completes): the sender holds at most the open
        bucket's tensors and :data:`IN_FLIGHT` posted buckets beyond its own weights, never the whole model (under
        ZeRO-3 each tensor is a gathered copy). Its checksum term and read-back sample are taken as it arrives.

        Returns ``{"bytes", "seconds", "checksum", "buckets", "samples"}`` (seconds: wall time of the transfer,
        less the time spent on checksums and samples; checksum: per tensor, whatever the bucketing; samples: name
        -> :func:`trainer_sample` of the tensor as sent, which the engines' read-back is compared with; empty with
        ``sample=False``, when nothing reads it back).
        Errors: :class:`WeightSyncError` when a broadcast fails or takes over ``timeout_s``."""
        bucket_bytes = bucket_bytes_of(bucket_mb)
        t0 = time.perf_counter()
        aside = 0.0  # seconds spent on checksums and samples, off the transfer's clock
        nbytes, total, count = 0, 0.0, 0
        samples: dict[str, torch.Tensor] = {}
        # posted broadcasts, oldest first: (work, what, the tensor posted: kept alive until its broadcast completes)
        inflight: list[tuple[object, str, torch.Tensor]] = []
        bucket: list[tuple[str, torch.Tensor]] = []
        bucket_dtype, bucket_nbytes, n_buckets = "", 0, 0
        csum_buf = torch.empty(CHECKSUM_CHUNK, dtype=torch.float64, device=self.device)  # every t is moved there

        def flush() -> None:
            nonlocal n_buckets
            while len(inflight) >= IN_FLIGHT:  # frees the staging slot this bucket reuses
                work, what, _ = inflight.pop(0)
                _wait(work, what, self.timeout_s)
            if len(bucket) == 1:
                what, flat = bucket[0][0], bucket[0][1]  # alone: sent as it is, no copy
            else:
                what = f"the bucket {bucket[0][0]} .. {bucket[-1][0]} ({len(bucket)} tensors)"
                buf = self._buffer(bucket_bytes, bucket[0][1].dtype, n_buckets % IN_FLIGHT)
                flat = buf[: sum(t.numel() for _, t in bucket)]
                torch.cat([t.reshape(-1) for _, t in bucket], out=flat)
            inflight.append((_post(self.pg, flat, what, self.timeout_s), what, flat))
            n_buckets += 1
            bucket.clear()  # the packed tensors are free now; a lone one lives in `inflight` until sent

        for name, t in named:
            t = t.detach().to(self.device).contiguous()
            s = spec_of(name, t)
            if bucket and not _joins(bucket_dtype, bucket_nbytes, s, bucket_bytes):
                flush()
            if not bucket:
                bucket_dtype, bucket_nbytes = s.dtype, 0
            ta = time.perf_counter()
            total += _checksum_term(count, t, csum_buf)
            if sample:
                samples[name] = trainer_sample(name, t)
            aside += time.perf_counter() - ta
            bucket.append((name, t))
            bucket_nbytes += s.nbytes
            nbytes += s.nbytes
            count += 1
            del t  # the bucket holds it until packed
        if bucket:
            flush()
        while inflight:
            work, what, _ = inflight.pop(0)
            _wait(work, what, self.timeout_s)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0 - aside
        return {"bytes": float(nbytes), "seconds": seconds, "checksum": total, "buckets": float(n_buckets),
                "samples": samples}


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A receive buffer (one bucket, or one tensor travelling alone); tests count the live ones through it."""
    return torch.empty(shape, dtype=dtype, device=device)


class Received:
    """What :func:`receive_stream` has received so far: the running checksum and the tensor count."""

    def __init__(self) -> None:
        self.checksum = 0.0
        self.count = 0


def receive_stream(
    pg, specs: list[WeightSpec], device: torch.device, timeout_s: float, bucket_mb: float, got: Received
) -> Iterator[tuple[str, torch.Tensor]]:
    """Engine side: receive every tensor of ``specs`` from rank 0, in the sender's buckets (``bucket_mb`` must be
    the sender's; :func:`plan_buckets`), yielding each ``(name, tensor)`` as soon as its bucket has arrived, so the
    consumer loads it while the next buckets travel. A tensor that travelled in a bucket is a view into that
    bucket's flat buffer; a bucket's memory is freed once the consumer drops its views. At most :data:`IN_FLIGHT`
    buckets are posted beyond the one being yielded: the receiver never holds the whole model.

    ``got`` accumulates the checksum (per tensor, as :meth:`WeightSender.send` computes it) and the count of
    tensors yielded; both are final only once the generator is exhausted, which the caller must do (a consumer that
    stops early would leave the sender's broadcasts unanswered: :func:`drain`).
    Errors: :class:`WeightSyncError` (failure, or over ``timeout_s``), raised from the iteration."""
    plan = plan_buckets(specs, bucket_bytes_of(bucket_mb))
    csum_buf = torch.empty(CHECKSUM_CHUNK, dtype=torch.float64, device=device)
    posted: list[tuple[object, str, list[tuple[int, str, torch.Tensor]]]] = []
    k = 0

    def post_next() -> None:
        nonlocal k
        idx = plan[k]
        k += 1
        dtype = DTYPES[specs[idx[0]].dtype]
        if len(idx) == 1:
            s = specs[idx[0]]
            flat = _empty(s.shape, dtype, device)
            items = [(idx[0], s.name, flat)]
            what = s.name
        else:
            flat = _empty((sum(specs[i].numel for i in idx),), dtype, device)
            items, off = [], 0
            for i in idx:
                s = specs[i]
                items.append((i, s.name, flat[off : off + s.numel].view(s.shape)))
                off += s.numel
            what = f"the bucket {specs[idx[0]].name} .. {specs[idx[-1]].name} ({len(idx)} tensors)"
        posted.append((_post(pg, flat, what, timeout_s), what, items))

    while k < len(plan) and len(posted) < IN_FLIGHT:
        post_next()
    while posted:
        work, what, items = posted.pop(0)
        _wait(work, what, timeout_s)
        if k < len(plan):
            post_next()  # keep IN_FLIGHT on the wire while the consumer loads this bucket
        while items:
            i, name, t = items.pop(0)
            got.checksum += _checksum_term(i, t, csum_buf)
            got.count += 1
            yield name, t
        del work, items, t


def drain(stream: Iterator[tuple[str, torch.Tensor]]) -> int:
    """Receive whatever ``stream`` (:func:`receive_stream`) has left, dropping it; returns how many tensors that was
    (0 when its consumer took them all)."""
    return sum(1 for _ in stream)


def receive_into(
    pg, specs: list[WeightSpec], device: torch.device, timeout_s: float, bucket_mb: float = 0.0
) -> tuple[list[tuple[str, torch.Tensor]], float]:
    """Engine side, all at once: every tensor of ``specs`` (:func:`receive_stream`, kept in a list: the whole
    model's bytes) and the checksum. For tests and benchmarks; the engines load as they receive.
    Errors: :class:`WeightSyncError` (failure, or over ``timeout_s``)."""
    got = Received()
    out = list(receive_stream(pg, specs, device, timeout_s, bucket_mb, got))
    return out, got.checksum


def checksums_match(a: float, b: float) -> bool:
    """Equal up to float64 summation-order noise (relative 1e-9)."""
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
