"""Peak memory and time of a micro-batch's logprobs + entropy, forward and backward, before and after issue 27.

The trainer (:meth:`rlvr.train.policy.PolicyTrainer._forward`) has the output layer's logits of the micro-batch's
N response tokens as one [N, V] tensor (bf16 under autocast on bf16 machines) that requires grad. On it:

- ``plain``: the path before issue 27, copied here: ``token_logprobs(logits.float()[None], ...)`` (a per-sequence
  ``z.gather - logsumexp(z)`` under plain autograd) and ``entropy_from_logits(logits.float()[None], ...)``
  (``logsumexp(z) - sum softmax(z) * where(isfinite(z), z, 0)``), each on its own fp32 copy;
- ``chunked``: :func:`rlvr.algos.logprobs.logprobs_and_entropy` (one pass, ``chunk_tokens`` rows at a time, backward
  recomputing each chunk's softmax);

with the entropy carrying a gradient (``ent=grad``: the entropy bonus) or not (``ent=nograd``: logged only), and a
loss like the trainer's (``-(lp * adv).mean() - 0.01 * entropy.mean()``) backpropagated into the logits. Each variant
runs in a fresh subprocess; its peak is ``ru_maxrss`` after forward + backward minus ``ru_maxrss`` once the logits
(and the other inputs) are allocated, so it counts what the computation adds: the logits' gradient ([N, V] in the
logits' dtype, both variants) and the rest (with glibc's mmap threshold fixed at 128 KiB, so that freed blocks
go back to the system and the high-water mark follows live memory). Times: the median of ``--repeats`` forward and
backward passes (the first is the peak run; the rest in the same process).

    .venv/bin/python benchmarks/logprob_memory.py                       # N=4096, V=151936, bf16: ~20 GB for plain
    .venv/bin/python benchmarks/logprob_memory.py --n 256 --v 4096      # seconds

One N x V fp32 tensor is N * V * 4 bytes: 2.49 GB at the default size.

Measured 2026-12-03 on a 2-core, 24 GB CPU machine (other jobs beside it, so the times are rough), V = 151936, bf16
logits, T = 0.7, the default chunk (441 rows), median of 2 passes:

    N     variant          peak GB  x NV fp32  fwd s  bwd s  peak/plain  time/plain
    1024  plain:grad         5.134       8.25   5.59   6.63       1.000       1.000
    1024  chunked:grad       0.670       1.08   2.03   1.68       0.131       0.303
    1024  plain:nograd       3.890       6.25   5.55   2.67       1.000       1.000
    1024  chunked:nograd     0.670       1.08   2.17   1.40       0.172       0.433
    2048  plain:grad        10.268       8.25  13.86  23.94       1.000       1.000
    2048  chunked:grad       0.938       0.75   3.61   3.38       0.091       0.185
    2048  plain:nograd       7.779       6.25  16.09   7.78       1.000       1.000
    2048  chunked:nograd     0.938       0.75   4.63   2.34       0.121       0.292
    4096  chunked:grad       1.608       0.65  16.30   5.36
    4096  chunked:nograd     1.608       0.65   7.09   3.74

The plain path keeps 8.25 (entropy with grad) or 6.25 (without) N x V fp32 tensors' worth at every N: at N = 4096
that is 20.5 / 15.6 GB, not run here (the machine had ~19 GB free). The chunked one adds the logits' bf16 gradient
(0.5 x NV fp32) and one chunk's work (~1.4 x 441 x V x 4 bytes = 0.37 GB, whatever N). Both give the same logprobs
and gradients; the entropies differ by ~2e-4 nats a row: the plain ``logsumexp(z) - sum p z`` loses that much to
cancellation in fp32 at this vocabulary (against float64 on 128 rows: max error 4.5e-4 before, 4.6e-6 after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = [("plain", "grad"), ("chunked", "grad"), ("plain", "nograd"), ("chunked", "nograd")]


def _maxrss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def _plain(logits, targets, temperature, ent_grad):
    """The code path before issue 27 (rlvr/algos/logprobs.py and PolicyTrainer._forward at a4cdfaa)."""
    import torch

    def scaled(x):
        z = x.float()
        return z if temperature == 1.0 else z / temperature

    z = scaled(logits.float()[None][0])
    lp = z.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)
    with torch.set_grad_enabled(ent_grad and torch.is_grad_enabled()):
        src = logits.float() if ent_grad else logits.detach().float()
        z = scaled(src)
        p = torch.softmax(z, dim=-1)
        z_finite = torch.where(torch.isfinite(z), z, torch.zeros_like(z))
        ent = torch.logsumexp(z, dim=-1) - (p * z_finite).sum(dim=-1)
    return lp, ent


def _chunked(logits, targets, temperature, ent_grad, chunk):
    from rlvr.algos.logprobs import logprobs_and_entropy

    return logprobs_and_entropy(logits, targets, temperature, need_entropy=True, entropy_grad=ent_grad,
                                chunk_tokens=chunk)


def worker(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    gen = torch.Generator().manual_seed(0)
    # drawn in its own dtype: an fp32 draw cast down would raise the baseline's high-water mark by N x V x 4 bytes
    logits = torch.randn(args.n, args.v, generator=gen, dtype=dtype).mul_(3).requires_grad_(True)
    targets = torch.randint(0, args.v, (args.n,), generator=gen)
    adv = torch.randn(args.n, generator=gen)
    variant, ent_mode = args.worker.split(":")
    ent_grad = ent_mode == "grad"

    def step(logits, targets, adv, chunk):
        t0 = time.perf_counter()
        if variant == "plain":
            lp, ent = _plain(logits, targets, args.temperature, ent_grad)
        else:
            lp, ent = _chunked(logits, targets, args.temperature, ent_grad, chunk)
        loss = -(lp * adv).mean() - 0.01 * ent.mean()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        return lp.detach(), ent.detach(), t1 - t0, t2 - t1

    # warm-up on a tiny case: imports, thread pools and kernels' first-use allocations stay out of the peak
    tiny = torch.randn(8, 64, dtype=torch.float32).to(dtype).requires_grad_(True)
    step(tiny, targets[:8] % 64, adv[:8], 3)
    del tiny
    base = _maxrss_bytes()
    lp, ent, fwd, bwd = step(logits, targets, adv, args.chunk)
    peak = _maxrss_bytes() - base
    out = dict(peak=peak, lp_sum=float(lp.double().sum()), ent_sum=float(ent.double().sum()),
               grad_norm=float(logits.grad.double().norm()), fwd=[fwd], bwd=[bwd])
    for _ in range(args.repeats - 1):
        logits.grad = None
        _, _, fwd, bwd = step(logits, targets, adv, args.chunk)
        out["fwd"].append(fwd)
        out["bwd"].append(bwd)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096, help="response tokens in the micro-batch (rows of the logits)")
    ap.add_argument("--v", type=int, default=151936, help="vocabulary size (Qwen2.5's 151936)")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16", help="the logits' dtype")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--chunk", type=int, default=None, help="chunk_tokens (default: the library's, 256 MiB fp32)")
    ap.add_argument("--repeats", type=int, default=3, help="timed forward+backward passes per variant")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated variants, e.g. plain:grad,chunked:grad")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    variants = [f"{a}:{b}" for a, b in VARIANTS]
    if args.only:
        variants = [v for v in variants if v in args.only.split(",")]
    gb = 1e9
    nv32 = args.n * args.v * 4 / gb
    print(f"N={args.n} V={args.v} logits {args.dtype}, T={args.temperature}, chunk={args.chunk or 'default'}; "
          f"one N x V fp32 tensor = {nv32:.3f} GB", flush=True)
    # a fixed mmap threshold: glibc's default raises it after each large free, then keeps freed chunk-sized blocks
    # in its heap, so ru_maxrss would count memory no tensor holds (measured: +20 MB at N=512, V=16384, chunk 64)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "131072")}
    res = {}
    for v in variants:
        cmd = [sys.executable, __file__, "--worker", v] + [
            x for k in ("n", "v", "dtype", "temperature", "chunk", "repeats", "threads")
            if getattr(args, k) is not None for x in (f"--{k}", str(getattr(args, k)))]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        if r.returncode != 0:
            print(f"{v}: failed (rc {r.returncode})\n{r.stderr[-2000:]}", flush=True)
            continue
        res[v] = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"  {v} done: peak {res[v]['peak'] / gb:.3f} GB", flush=True)

    print(f"\n{'variant':16s} {'peak GB':>8s} {'x NV fp32':>9s} {'fwd s':>7s} {'bwd s':>7s} {'peak/plain':>10s} "
          f"{'time/plain':>10s}  lp_sum / ent_sum / |grad|")
    for v, r in res.items():
        plain = res.get("plain:" + v.split(":")[1])
        t = statistics.median(r["fwd"]) + statistics.median(r["bwd"])
        ratio_m = ratio_t = ""
        if plain:
            ratio_m = f"{r['peak'] / plain['peak']:.3f}"
            ratio_t = f"{t / (statistics.median(plain['fwd']) + statistics.median(plain['bwd'])):.3f}"
        print(f"{v:16s} {r['peak'] / gb:8.3f} {r['peak'] / gb / nv32:9.2f} {statistics.median(r['fwd']):7.3f} "
              f"{statistics.median(r['bwd']):7.3f} {ratio_m:>10s} {ratio_t:>10s}  "
              f"{r['lp_sum']:.4f} / {r['ent_sum']:.4f} / {r['grad_norm']:.6f}")


if __name__ == "__main__":
    main()
