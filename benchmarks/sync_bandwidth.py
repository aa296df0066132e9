"""Weight-sync bandwidth over gloo on loopback: bare broadcast vs rlvr's per-tensor and packed (bucketed) paths.

Two processes (``torch.multiprocessing`` spawn) form rlvr's own weight-sync group (``rlvr.sync.weights``:
``TCPStore`` + ``ProcessGroupGloo`` on 127.0.0.1). The weights have the real parameter shapes of SmolLM2-135M
(``named_parameters`` of a meta-device ``LlamaForCausalLM`` built from the embedded model's ``config.json``: 272
tensors, the tied head not among them, as the trainer sends them), random values in ``--dtype``. Rows:

- ``bare``: one ``broadcast`` of ONE flat tensor of the same total bytes (the receiver allocates it each time, as
  a sync does); ``bare, reused buffer``: the receiver reuses one buffer (no page faults on the receiving side);
- ``per-tensor``: ``WeightSender.send`` / ``receive_into`` with ``bucket_mb=0`` (one broadcast per parameter),
  with ``IN_FLIGHT`` broadcasts posted at once (``in flight 1`` is the path before packing: post, wait, next);
- ``packed N MB``: ``bucket_mb=N``.

Rows are interleaved within each repeat, in a shuffled order (drift on a shared machine hits them alike).
``send s`` is the sender's wall time without its checksum (``seconds`` of ``send``: what ``sync/send_seconds``
and ``sync/gbps`` report); ``recv s`` is the receiver's whole ``receive_into``, which also takes the per-tensor
checksums (printed apart). Both start after an ``allreduce`` barrier. GB = 1e9 bytes.

Then, separately, the engine-side reload of the transformers engine (``HFEngine.receive_weights``: a ``copy_`` of
each received tensor into a SmolLM2-135M model in ``--dtype``), from per-tensor and from packed tensors (views).

``--vllm`` adds a real vLLM engine's ``receive_weights`` (SmolLM2-135M in-process on CPU): its wall time, the
``receive_into`` share, and the rest (``reload_weights``, tied-layer refresh, prefix-cache reset).

Run (about 1-2 min on 2 idle cores, one more with ``--vllm``):

    PYTHONPATH=. .venv/bin/python benchmarks/sync_bandwidth.py [--vllm]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.multiprocessing as mp

BUCKETS_MB = (1.0, 4.0, 16.0, 64.0, 256.0)


def smollm2_specs(dtype: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of SmolLM2-135M's parameters in ``named_parameters`` order (the trainer's send order)."""
    from transformers import AutoConfig, LlamaForCausalLM

    from rlvr.models import resolve_model

    cfg = AutoConfig.from_pretrained(resolve_model("smollm2-135m-instruct"))
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    return [(n, tuple(p.shape), dtype) for n, p in model.named_parameters()]


def rows(buckets_mb: tuple[float, ...]) -> list[tuple[str, str, float, int]]:
    """(label, kind, bucket_mb, in_flight) of every measured row."""
    out = [("bare", "bare", 0.0, 1), ("bare, reused buffer", "bare_reuse", 0.0, 1)]
    out += [(f"per-tensor, in flight {k}", "rlvr", 0.0, k) for k in (1, 2)]
    out += [(f"packed {mb:g} MB, in flight {k}", "rlvr", mb, k) for mb in buckets_mb for k in (1, 2)]
    return out


def _barrier(pg) -> None:
    t = torch.zeros(1)
    pg.allreduce([t]).wait()


def _worker(rank: int, port: int, specs_t: list, table: list, repeats: int, out: dict) -> None:
    torch.set_num_threads(1)
    import rlvr.sync.weights as W

    specs = [W.WeightSpec(n, tuple(s), d) for n, s, d in specs_t]
    dtype = W.DTYPES[specs[0].dtype]
    total_numel = sum(s.numel for s in specs)
    common = dict(host="127.0.0.1", port=port, world_size=2, backend="gloo", timeout_s=120, name="bench")
    if rank == 0:
        sender = W.WeightSender(**common)
        pg = sender.pg
        gen = torch.Generator().manual_seed(0)
        named = [(s.name, torch.randn(s.shape, generator=gen).to(dtype)) for s in specs]
        flat = torch.randn(total_numel, generator=gen).to(dtype)
    else:
        pg = W.create_group(rank=1, **common)
        reused = torch.empty(total_numel, dtype=dtype)
    times: dict[str, list[float]] = {label: [] for label, *_ in table}
    checks: dict[str, float] = {}
    import random

    order = random.Random(0)  # the same row order on both ranks, shuffled per repeat
    for rep in range(repeats + 1):  # repeat 0 warms up (connections, staging buffers) and is not counted
        for label, kind, mb, k in order.sample(table, len(table)):
            W.IN_FLIGHT = k
            _barrier(pg)
            t0 = time.perf_counter()
            if kind in ("bare", "bare_reuse"):
                t = flat if rank == 0 else (reused if kind == "bare_reuse" else torch.empty(total_numel, dtype=dtype))
                W._broadcast(pg, t, "bare", 120)
            elif rank == 0:
                res = sender.send(iter(named), bucket_mb=mb)
                checks[label] = res["checksum"]
            else:
                _, checks[label] = W.receive_into(pg, specs, torch.device("cpu"), 120, bucket_mb=mb)
            dt = time.perf_counter() - t0
            t = _ = None  # an engine drops what it received once loaded: the next receive may reuse the memory
            if rank == 0 and kind == "rlvr":
                dt = res["seconds"]  # the transfer; send() takes its checksum after the clock stops
            if rep > 0:
                times[label].append(dt)
    out[rank] = {"times": times, "checks": checks}
    if rank == 1:  # the checksum share of "recv s": the same sum over a set of tensors of the same specs
        gen = torch.Generator().manual_seed(2)
        got = [(s.name, torch.randn(s.shape, generator=gen).to(dtype)) for s in specs]
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            sum(W._checksum_term(i, t) for i, (_, t) in enumerate(got))
            ts.append(time.perf_counter() - t0)
        out["checksum_s"] = statistics.median(ts)
        del got
    if rank == 1:
        out["reload"] = _reload_cost(specs, pg, dtype, repeats)


def _reload_cost(specs, pg, dtype, repeats) -> dict[str, float]:
    """Seconds of ``HFEngine.receive_weights``' load step (``copy_`` of each received tensor into the model's
    parameter), per-tensor tensors vs views into 16 MB buckets (receiving side only, no network)."""
    from transformers import AutoConfig, LlamaForCausalLM

    from rlvr.models import resolve_model
    from rlvr.sync.weights import plan_buckets

    cfg = AutoConfig.from_pretrained(resolve_model("smollm2-135m-instruct"))
    model = LlamaForCausalLM(cfg).to(dtype)
    params = dict(model.named_parameters())
    gen = torch.Generator().manual_seed(1)
    alone = [(s.name, torch.randn(s.shape, generator=gen).to(dtype)) for s in specs]
    views = []
    for idx in plan_buckets(specs, 16 * 10**6):
        flat = torch.cat([alone[i][1].reshape(-1) for i in idx])
        off = 0
        for i in idx:
            views.append((specs[i].name, flat[off : off + specs[i].numel].view(specs[i].shape)))
            off += specs[i].numel
    res = {}
    for label, named in (("per-tensor", alone), ("packed 16 MB (views)", views)):
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            with torch.no_grad():
                for n, t in named:
                    params[n].copy_(t)
            ts.append(time.perf_counter() - t0)
        res[label] = statistics.median(ts)
    return res


def _vllm_worker(rank: int, port: int, specs_t: list, buckets_mb: tuple, repeats: int, out: dict) -> None:
    """``--vllm``: rank 0 sends with ``WeightSender``; rank 1 is a real vLLM engine (``VLLMEngine``, in-process on
    CPU) receiving with ``receive_weights`` (transfer + ``reload_weights`` + tied-layer refresh + prefix-cache
    reset). The transfer share is timed by wrapping ``vllm_ext.receive_into``; the rest is the reload."""
    torch.set_num_threads(1)
    import rlvr.sync.weights as W

    specs = [W.WeightSpec(n, tuple(s), d) for n, s, d in specs_t]
    common = dict(host="127.0.0.1", port=port, world_size=2, backend="gloo", timeout_s=300, name="bench-vllm")
    order = [mb for _ in range(repeats + 1) for mb in buckets_mb]  # the first round warms up
    if rank == 0:
        sender = W.WeightSender(**common)
        gen = torch.Generator().manual_seed(0)
        named = [(s.name, torch.randn(s.shape, generator=gen).to(W.DTYPES[s.dtype])) for s in specs]
        for mb in order:
            sender.send(iter(named), bucket_mb=mb)
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # a reload logs every weight at WARNING
    import rlvr.sync.vllm_ext as ext
    from rlvr.models import resolve_model
    from rlvr.rollout.vllm_engine import VLLMEngine

    t0 = time.perf_counter()
    engine = VLLMEngine(resolve_model("smollm2-135m-instruct"), dtype=specs[0].dtype, max_model_len=256, threads=1)
    out["vllm_start_s"] = time.perf_counter() - t0
    engine.init_weight_sync("127.0.0.1", port, 1, 2, "gloo", 300, "bench-vllm")
    transfer: list[float] = []
    plain = ext.receive_into

    def timed(*a, **k):
        t = time.perf_counter()
        res = plain(*a, **k)
        transfer.append(time.perf_counter() - t)
        return res

    ext.receive_into = timed
    whole: dict[float, list[float]] = {mb: [] for mb in buckets_mb}
    part: dict[float, list[float]] = {mb: [] for mb in buckets_mb}
    for k, mb in enumerate(order):
        t = time.perf_counter()
        engine.receive_weights(specs_t, k + 1, mb)
        if k >= len(buckets_mb):
            whole[mb].append(time.perf_counter() - t)
            part[mb].append(transfer[-1])
    out["vllm"] = {mb: (statistics.median(whole[mb]), statistics.median(part[mb])) for mb in buckets_mb}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--buckets-mb", default=",".join(f"{b:g}" for b in BUCKETS_MB))
    ap.add_argument("--vllm", action="store_true", help="also time a real vLLM engine's receive + reload (~1-2 min)")
    args = ap.parse_args()
    from rlvr.hardware import free_port
    from rlvr.sync.weights import DTYPES, WeightSpec, checksums_match, plan_buckets

    specs_t = smollm2_specs(args.dtype)
    specs = [WeightSpec(n, s, d) for n, s, d in specs_t]
    nbytes = sum(s.nbytes for s in specs)
    buckets_mb = tuple(float(b) for b in args.buckets_mb.split(","))
    table = rows(buckets_mb)
    biggest = max(specs, key=lambda s: s.nbytes)
    print(f"SmolLM2-135M shapes: {len(specs)} tensors, dtype {args.dtype} "
          f"({torch.empty((), dtype=DTYPES[args.dtype]).element_size()} bytes/element), {nbytes} bytes "
          f"({nbytes / 1e9:.3f} GB); largest {biggest.nbytes} bytes ({biggest.name})")
    print(f"gloo on 127.0.0.1, 2 processes, torch {torch.__version__}, {args.repeats} repeats (+1 warm-up), "
          f"torch threads 1 per process, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    with mp.Manager() as m:
        out = m.dict()
        mp.spawn(_worker, args=(free_port(), specs_t, table, args.repeats, out), nprocs=2, join=True)
        out = dict(out)
    send, recv = out[0], out[1]
    for label in send["checks"]:
        assert checksums_match(send["checks"][label], recv["checks"][label]), label
    ref = next(iter(send["checks"].values()))
    assert all(checksums_match(c, ref) for c in send["checks"].values()), "checksum differs between paths"
    bare = statistics.median(send["times"]["bare"])
    reused = statistics.median(send["times"]["bare, reused buffer"])
    print(f"\n{'path':<28} {'broadcasts':>10} {'send s':>8} {'GB/s':>6} {'x bare':>7} {'x reused':>8} {'min s':>7} "
          f"{'recv s':>8}")
    for label, kind, mb, _ in table:
        n = 1 if kind.startswith("bare") else len(plan_buckets(specs, int(mb * 1e6)))
        s = statistics.median(send["times"][label])
        r = statistics.median(recv["times"][label])
        lo = min(send["times"][label])
        print(f"{label:<28} {n:>10} {s:>8.3f} {nbytes / 1e9 / s:>6.2f} {bare / s:>7.2f} {reused / s:>8.2f} "
              f"{lo:>7.3f} {r:>8.3f}")
    print("(send s, recv s: medians; x bare: bare send s / this send s, so 1.00 = as fast as one broadcast; x reused:\n"
          " the same against the reused-buffer bare; min s: the fastest send; recv s includes the receiver's\n"
          f" checksums, {out['checksum_s']:.3f} s of it; load average {os.getloadavg()[0]:.1f} at the end)")
    print("checksums: sender == receiver on every path, and equal across paths")
    print("\nengine-side reload, transformers engine (copy_ into a SmolLM2-135M model, median s):")
    for label, s in out["reload"].items():
        print(f"  {label:<24} {s:.3f}")
    if args.vllm:
        with mp.Manager() as m:
            vout = m.dict()
            vbuckets = (0.0, 4.0, 16.0)
            mp.spawn(_vllm_worker, args=(free_port(), specs_t, vbuckets, args.repeats, vout), nprocs=2, join=True)
            vout = dict(vout)
        print(f"\nengine-side reload, vLLM engine (SmolLM2-135M, {args.dtype}, in-process on CPU; started in "
              f"{vout['vllm_start_s']:.0f} s), receive_weights, median s:")
        print(f"  {'bucket_mb':<10} {'whole':>7} {'receive_into':>13} {'reload + reset':>15}")
        for mb, (whole, part) in vout["vllm"].items():
            print(f"  {mb:<10g} {whole:>7.3f} {part:>13.3f} {whole - part:>15.3f}")


if __name__ == "__main__":
    main()
