"""Each stage of the smoke step against its bare limit, measured side by side on this machine (issue 14).

One run of this script measures, on the shapes of ``recipes/smoke_cpu.yaml`` (SmolLM2-135M-Instruct, 8 prompts x 8
samples, 64 new tokens, T = 1, the recipe's dtype and threads), each rlvr stage and its bare counterpart, in child
processes of this one, interleaved repeat by repeat (this machine's speed drifts: medians and ratios, not seconds):

- **rollout**: rlvr's :class:`rlvr.rollout.vllm_engine.VLLMEngine` (built as :class:`rlvr.runtime.roles.Roles` builds
  it, ``generate`` returning :class:`rlvr.types.Completion` with logprobs, seeded) against a bare ``vllm.LLM`` with
  the same engine settings (``enforce_eager``, the engine core in-process, KV-cache size, model length) and
  ``SamplingParams(n, max_tokens, temperature)`` without logprobs, on the same chat-templated prompts; with
  ``--bare-defaults`` also a bare ``vllm.LLM`` with vLLM's own defaults (on CPU: ``torch.compile`` and the engine
  core in its own process). Figure: response tokens per second; goal ratio >= 0.9.
- **train**: :meth:`rlvr.train.policy.PolicyWorker.train_step` (the recipe's backend, dtype and micro-batch size)
  on the real rollout batch of the rollout stage, against a bare training step a user would write on the same
  sequences: a fresh transformers model, micro-batches of ``trainer.micro_batch_size`` in batch order padded to
  their longest, transformers' own causal-LM loss on the response tokens (``labels`` -100 elsewhere), one
  ``torch.optim.AdamW`` step, under the same autocast rule as the trainer. Goal ratio rlvr / bare <= 1.2.
- **sync**: the transfer, ``WeightSender.send`` of the trainer's weights into a receiving process (rlvr's packed
  buckets, ``sync.bucket_mb``), against one gloo ``broadcast`` of one flat tensor of the same bytes
  (``benchmarks/sync_bandwidth.py`` has the full matrix); goal ratio bare / rlvr >= 0.8. The engine-side reload
  (vLLM ``reload_weights`` and its refresh, the rest of ``timing/sync_s``) is measured apart in the real run.
- **the real loop** (``--real-steps K``, 0 skips it): ``rlvr train recipes/smoke_cpu.yaml`` for K steps
  (validation, sample tables and checkpoints off) with each ``--code`` tree: per-stage medians from its
  ``metrics.jsonl`` (steps after the first), the controller and Ray overhead (``timing/step_s`` minus rollout,
  reward, judge, refill, the update inside the trainer and sync; goal <= 5% of the step), and the reward per step against wall-clock.
- **TRL** (``--trl PYTHON``, the interpreter of an environment with TRL, see ``benchmarks/trl_smoke.py``): TRL's
  GRPOTrainer on the same task for K steps; goal: rlvr's step <= 0.5x TRL's.

Peak memory: each child's peak RSS (``ru_maxrss``, MB; the real loop's roles are Ray actors and are not counted).

    .venv/bin/python benchmarks/stage_limits.py --repeats 3 --real-steps 4 --trl /tmp/trl/bin/python
    .venv/bin/python benchmarks/stage_limits.py --code /tmp/old_checkout --code . --real-steps 4   # before/after

(about 25 minutes on 2 cores with everything; ``--skip rollout,train,sync`` leaves only the real loop).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# -- child processes -------------------------------------------------------------------------------------------------
def _peak_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _recipe(overrides: list[str]):
    """``recipes/smoke_cpu.yaml`` of the rlvr tree being measured (the one ``import rlvr`` finds) with ``overrides``."""
    import rlvr
    from rlvr.recipe import load_recipe

    return load_recipe(str(Path(rlvr.__file__).resolve().parents[1] / "recipes" / "smoke_cpu.yaml"), overrides)


def _prompts(r):
    """The first ``prompts_per_step`` training prompts of the recipe (chat template, as the controller builds them)."""
    from transformers import AutoTokenizer

    from rlvr.data.datasets import build_prompts
    from rlvr.data.generated import generated_split
    from rlvr.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(r.model.path))
    rows = generated_split(r.data.generated, r.run.seed)[: r.rollout.prompts_per_step]
    rows = [{"question": x["question"], "gold": x["answer"], "row": i} for i, x in enumerate(rows)]
    prompts, _ = build_prompts(rows, tok, r.data)
    return prompts, tok


def _resolved_dtype(r) -> str:
    return r.model.dtype  # ``auto`` is resolved when the recipe loads


def rollout_child(conn, kind: str, overrides: list[str]) -> None:
    """Serve ``gen`` commands: ``kind`` 'rlvr' (VLLMEngine) or 'bare' (vllm.LLM with defaults). Replies
    {"s", "tokens", "peak_mb"} per command; the rlvr engine also returns the completions of its first call."""
    r = _recipe(overrides)
    prompts, tok = _prompts(r)
    dtype = _resolved_dtype(r)
    from rlvr.models import resolve_model

    model_dir = resolve_model(r.model.path)
    ro = r.rollout
    if kind == "rlvr":
        from rlvr.rollout.vllm_engine import VLLMEngine
        from rlvr.types import SamplingConfig

        eng = VLLMEngine(model_dir, dtype=dtype, max_model_len=r.data.max_prompt_tokens + ro.max_new_tokens,
                         seed=r.run.seed, kv_cache_gib=ro.kv_cache_gib, enforce_eager=ro.enforce_eager,
                         threads=ro.threads)  # fmt: skip
        sampling = SamplingConfig(n=ro.samples_per_prompt, max_new_tokens=ro.max_new_tokens,
                                  temperature=ro.temperature, seed=r.run.seed)  # fmt: skip

        def gen():
            comps = eng.generate(prompts, sampling)
            return sum(len(c.token_ids) for c in comps), comps
    else:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(ro.kv_cache_gib)))))
        os.environ["OMP_NUM_THREADS"] = str(ro.threads)
        settings = {}
        if kind == "bare":  # the engine settings rlvr uses on CPU (eager, the engine in this process, unbound)
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            settings["enforce_eager"] = ro.enforce_eager
        import torch
        from vllm import LLM, SamplingParams

        torch.set_num_threads(ro.threads)
        llm = LLM(model=model_dir, dtype=dtype, max_model_len=r.data.max_prompt_tokens + ro.max_new_tokens,
                  seed=r.run.seed, **settings)  # fmt: skip
        params = SamplingParams(n=ro.samples_per_prompt, max_tokens=ro.max_new_tokens, temperature=ro.temperature)

        def gen():
            outs = llm.generate([{"prompt_token_ids": p.prompt_ids} for p in prompts], params, use_tqdm=False)
            return sum(len(o.token_ids) for out in outs for o in out.outputs), None

    gen()  # warm-up
    first = True
    while conn.recv() == "gen":
        t0 = time.perf_counter()
        n, comps = gen()
        s = time.perf_counter() - t0
        reply = {"s": s, "tokens": n, "peak_mb": _peak_mb()}
        if first and comps is not None:
            reply["completions"] = [c.__dict__ for c in comps]
        first = False
        conn.send(reply)
    conn.close()


def _train_batch(completions: list[dict], pad_id: int, max_new_tokens: int):
    import torch

    from rlvr.train.batch import pack
    from rlvr.types import Completion

    comps = [Completion(**c) for c in completions]
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(len(comps), generator=g)  # the update's cost does not depend on the advantages' values
    return pack(comps, adv, pad_id, max_new_tokens)


def _padded(batch, order: list[int], micro: int) -> int:
    """Token positions a forward over ``order`` in micro-batches of ``micro`` computes (each padded to its longest)."""
    lengths = batch.attention_mask.sum(1)
    return sum(len(order[k : k + micro]) * int(lengths[order[k : k + micro]].max()) for k in range(0, len(order), micro))


def train_child(conn, overrides: list[str], completions: list[dict], also: list[str]) -> None:
    """Serve ``rlvr`` / ``also`` / ``bare`` commands: one rlvr train_step (the recipe; ``also``: the recipe with those
    overrides too), or one bare training step, on the same batch."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.models import resolve_model
    from rlvr.hardware import set_threads
    from rlvr.hardware import free_port
    from rlvr.train.policy import PolicyWorker

    r = _recipe(overrides)
    model_dir = resolve_model(r.model.path)
    _, tok = _prompts(r)
    batch = _train_batch(completions, tok.pad_token_id or 0, r.rollout.max_new_tokens)
    set_threads(r.trainer.threads)
    worker = PolicyWorker(r, model_dir, 0, 1, "127.0.0.1", free_port())
    other = PolicyWorker(_recipe([*overrides, *also]), model_dir, 0, 1, "127.0.0.1", free_port()) if also else None
    bare = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    bare.config.use_cache = False
    bare.train()
    opt = torch.optim.AdamW(bare.parameters(), lr=r.trainer.lr, betas=r.trainer.betas,
                            weight_decay=r.trainer.weight_decay)  # fmt: skip
    amp = worker.amp_dtype
    micro = r.trainer.micro_batch_size
    n = len(batch)

    def bare_step() -> dict:
        padded = 0
        for k in range(0, n, micro):
            mb = batch.select(list(range(k, min(n, k + micro))))
            labels = mb.input_ids.clone()
            labels[:, 1:][mb.loss_mask == 0] = -100
            labels[:, 0] = -100
            padded += mb.input_ids.numel()
            ctx = torch.autocast("cpu", dtype=amp) if amp is not None else torch.autocast("cpu", enabled=False)
            with ctx:
                loss = bare(input_ids=mb.input_ids, attention_mask=mb.attention_mask, labels=labels).loss
            (loss * (mb.loss_mask.sum() / batch.loss_mask.sum())).backward()
        torch.nn.utils.clip_grad_norm_(bare.parameters(), r.trainer.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return {"padded_tokens": padded}

    def rlvr_step(w) -> dict:
        stats = w.train_step(batch)
        return {"inner_s": stats.get("timing/train_inner_s", float("nan"))}

    rlvr_step(worker), bare_step()  # warm-up (allocator, DeepSpeed's first step)
    if other is not None:
        rlvr_step(other)
    by_len = sorted(range(n), key=lambda j: -int(batch.attention_mask[j].sum()))
    info = {"sequences": n, "tokens": int(batch.attention_mask.sum()), "response_tokens": int(batch.loss_mask.sum()),
            "padded_batch_order": _padded(batch, list(range(n)), micro), "padded_length_sorted": _padded(batch, by_len, micro)}
    while (cmd := conn.recv()) in ("rlvr", "also", "bare"):
        t0 = time.perf_counter()
        extra = rlvr_step(worker) if cmd == "rlvr" else rlvr_step(other) if cmd == "also" else bare_step()
        conn.send({"s": time.perf_counter() - t0, "peak_mb": _peak_mb(), **info, **extra})
    conn.close()


def sync_child(overrides: list[str], repeats: int, out) -> None:
    """Rank 0 of a two-process gloo group sending the trainer's real weights: rlvr's packed send and one bare
    broadcast of the same bytes, alternating ``repeats`` times. Puts {"rlvr": [s], "bare": [s], "gb"} on ``out``."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.models import resolve_model
    from rlvr.hardware import free_port
    from rlvr.sync.weights import DTYPES, WeightSender, _broadcast, spec_of

    r = _recipe(overrides)
    dtype = DTYPES[_resolved_dtype(r)]
    model = AutoModelForCausalLM.from_pretrained(resolve_model(r.model.path), dtype=torch.float32)
    named = [(n, p.detach().to(dtype)) for n, p in model.named_parameters()]
    specs = [spec_of(n, t) for n, t in named]
    port = free_port()
    ctx = mp.get_context("spawn")
    peer = ctx.Process(target=_sync_peer, args=(port, [(s.name, s.shape, s.dtype) for s in specs], repeats,
                                                r.sync.bucket_mb, r.sync.timeout_s))  # fmt: skip
    peer.start()
    sender = WeightSender(host="127.0.0.1", port=port, world_size=2, backend="gloo", timeout_s=r.sync.timeout_s,
                          name="bench")  # fmt: skip
    pg = sender.pg
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    flat = torch.empty(nbytes, dtype=torch.uint8)
    res = {"rlvr": [], "bare": [], "gb": nbytes / 1e9, "bucket_mb": r.sync.bucket_mb}
    for _ in range(repeats):
        pg.barrier().wait()
        t0 = time.perf_counter()
        _broadcast(pg, flat, "bare", r.sync.timeout_s)
        res["bare"].append(time.perf_counter() - t0)
        pg.barrier().wait()
        res["rlvr"].append(sender.send(iter(named), r.sync.bucket_mb)["seconds"])
    peer.join(timeout=120)
    out.put(res)


def _sync_peer(port: int, specs, repeats: int, bucket_mb: float, timeout_s: float) -> None:
    import torch

    from rlvr.sync.weights import WeightSpec, _broadcast, create_group, receive_into

    pg = create_group(host="127.0.0.1", port=port, rank=1, world_size=2, backend="gloo", timeout_s=timeout_s,
                      name="bench")  # fmt: skip
    wspecs = [WeightSpec(n, tuple(s), d) for n, s, d in specs]
    nbytes = sum(s.nbytes for s in wspecs)
    for _ in range(repeats):
        pg.barrier().wait()
        flat = torch.empty(nbytes, dtype=torch.uint8)  # allocated per sync, as a receiver does
        _broadcast(pg, flat, "bare", timeout_s)
        pg.barrier().wait()
        receive_into(pg, wspecs, torch.device("cpu"), timeout_s, bucket_mb)


# -- the real loop ---------------------------------------------------------------------------------------------------
STAGES = ("rollout", "reward", "judge", "refill", "train", "sync")
"""The stages of ``timing/*`` a step is made of (``rlvr.metrics.names``: ``train`` is the update inside the trainer,
so its call's Ray overhead counts as the controller's; ``judge`` and ``refill`` are absent where unused)."""


def real_run(code: Path, steps: int, seed: int, extra: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix="rlvr-stage-"))
    cmd = [sys.executable, "-m", "rlvr.cli", "train", str(code / "recipes" / "smoke_cpu.yaml"), f"run.steps={steps}",
           f"run.seed={seed}", "validation.every_steps=0", "validation.at_start=false", "checkpoint.every_steps=0",
           "metrics.samples_every=0", f"run.output_dir={out}", *extra]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(code))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    runs = list(out.glob("*/metrics.jsonl"))
    if proc.returncode or not runs:
        raise RuntimeError(f"{code}: rlvr train failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in runs[0].read_text().splitlines() if x.strip()]
    rows = [x for x in rows if "timing/step_s" in x]
    return {"code": str(code), "rows": rows, "wall_s": wall, "console_lines": len((proc.stdout + proc.stderr).splitlines())}


def _med(rows: list[dict], key: str) -> float:
    vals = [x[key] for x in rows[1:] or rows if key in x]
    return statistics.median(vals) if vals else float("nan")


def trl_run(python: str, steps: int, seed: int, dtype: str) -> list[dict]:
    proc = subprocess.run([python, str(REPO / "benchmarks" / "trl_smoke.py"), "--steps", str(steps), "--seed", str(seed),
                           "--dtype", dtype], capture_output=True, text=True, cwd=REPO)  # fmt: skip
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith('{"step"')]  # TRL prints dicts too
    if proc.returncode or not rows:
        raise RuntimeError(f"TRL failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return rows


# -- driver ----------------------------------------------------------------------------------------------------------
def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--real-steps", type=int, default=4, help="steps of the real loop per --code tree (0: skip)")
    p.add_argument("--code", action="append", type=Path, help="an rlvr source tree for the real loop (repeatable; "
                   "default: this one); the stage rows always measure the rlvr importable here")
    p.add_argument("--trl", help="python of an environment with TRL 1.16 (benchmarks/trl_smoke.py); omit to skip")
    p.add_argument("--bare-defaults", action="store_true", help="also a bare vllm.LLM with vLLM's own defaults "
                   "(on CPU: torch.compile and the engine core in its own process; ~2-5 min more to start)")
    p.add_argument("--train-also", default="", help="space-separated overrides of a second rlvr trainer measured "
                   "beside the first (e.g. 'trainer.backend=deepspeed')")
    p.add_argument("--skip", default="", help="comma list of rollout,train,sync to skip")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write every figure here")
    p.add_argument("overrides", nargs="*", help="recipe overrides for every stage (e.g. model.dtype=float32)")
    a = p.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    ov = [f"run.seed={a.seed}", *a.overrides]
    r = _recipe(ov)
    print(f"smoke shapes: {r.rollout.prompts_per_step} prompts x {r.rollout.samples_per_prompt} samples, "
          f"{r.rollout.max_new_tokens} new tokens, dtype {_resolved_dtype(r)}, rollout threads {r.rollout.threads}, "
          f"trainer {r.trainer.backend} (ZeRO {r.trainer.zero_stage}) threads {r.trainer.threads}, "
          f"micro-batch {r.trainer.micro_batch_size}; {a.repeats} repeats, medians", flush=True)
    ctx = mp.get_context("spawn")
    report: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}}
    table: list[tuple[str, str, str, str, str]] = []  # stage, rlvr, bare, ratio, goal
    completions = None

    if "rollout" not in skip or "train" not in skip:
        pipes = {}
        procs = []
        kinds = ("rlvr", "bare", *(("bare_defaults",) if a.bare_defaults else ())) if "rollout" not in skip else ("rlvr",)
        for kind in kinds:
            here, there = ctx.Pipe()
            proc = ctx.Process(target=rollout_child, args=(there, kind, ov))
            proc.start()
            pipes[kind], procs = here, procs + [proc]
        res: dict[str, list[dict]] = {k: [] for k in pipes}
        for _ in range(a.repeats if "rollout" not in skip else 1):
            for kind, conn in pipes.items():
                conn.send("gen")
                res[kind].append(conn.recv())
        for conn in pipes.values():
            conn.send("stop")
        for proc in procs:
            proc.join(timeout=120)
        completions = res["rlvr"][0]["completions"]
        if "rollout" not in skip:
            tps = {k: statistics.median(x["tokens"] / x["s"] for x in v) for k, v in res.items()}
            report["rollout"] = {k: [{kk: vv for kk, vv in x.items() if kk != "completions"} for x in v]
                                 for k, v in res.items()}  # fmt: skip
            table.append(("rollout (tokens/s)", f"{tps['rlvr']:.0f}", f"{tps['bare']:.0f}",
                          _ratio(tps["rlvr"], tps["bare"]), ">= 0.9"))  # fmt: skip
            if "bare_defaults" in tps:
                table.append(("rollout vs vLLM's defaults (tokens/s)", f"{tps['rlvr']:.0f}",
                              f"{tps['bare_defaults']:.0f}", _ratio(tps["rlvr"], tps["bare_defaults"]), ">= 0.9"))
            print("rollout: " + ", ".join(f"{k} {v:.0f} tokens/s" for k, v in tps.items()) + "; peak RSS "
                  + ", ".join(f"{k} {max(x['peak_mb'] for x in v):.0f} MB" for k, v in res.items()), flush=True)

    if "train" not in skip:
        here, there = ctx.Pipe()
        also = a.train_also.split() if a.train_also else []
        proc = ctx.Process(target=train_child, args=(there, ov, completions, also))
        proc.start()
        res = {"rlvr": [], "bare": [], **({"also": []} if also else {})}
        for _ in range(a.repeats):
            for kind in res:
                here.send(kind)
                res[kind].append(here.recv())
        here.send("stop")
        proc.join(timeout=120)
        report["train"] = res
        med = {k: statistics.median(x["s"] for x in v) for k, v in res.items()}
        info = res["bare"][0]
        table.append(("train (s)", f"{med['rlvr']:.1f}", f"{med['bare']:.1f}", _ratio(med["rlvr"], med["bare"]),
                      "<= 1.2"))  # fmt: skip
        if also:
            table.append((f"train, {a.train_also} (s)", f"{med['also']:.1f}", f"{med['bare']:.1f}",
                          _ratio(med["also"], med["bare"]), "<= 1.2"))  # fmt: skip
        print(f"train: {info['sequences']} sequences, {info['tokens']} tokens ({info['response_tokens']} response); "
              f"micro-batches padded to {info['padded_batch_order']} positions in batch order (bare), "
              f"{info['padded_length_sorted']} length-sorted; " + ", ".join(f"{k} {v:.1f} s" for k, v in med.items())
              + f"; peak RSS {max(x['peak_mb'] for v in res.values() for x in v):.0f} MB (all models)", flush=True)

    if "sync" not in skip:
        q = ctx.Queue()
        proc = ctx.Process(target=sync_child, args=(ov, a.repeats + 1, q))
        proc.start()
        s = q.get(timeout=1800)
        proc.join(timeout=120)
        report["sync"] = s
        rl, bare = statistics.median(s["rlvr"][1:]), statistics.median(s["bare"][1:])
        table.append((f"sync transfer (GB/s, {s['gb']:.3f} GB)", f"{s['gb'] / rl:.2f}", f"{s['gb'] / bare:.2f}",
                      _ratio(bare, rl), ">= 0.8"))  # fmt: skip
        print(f"sync: {s['gb']:.3f} GB, bucket {s['bucket_mb']} MB: rlvr {rl:.3f} s, bare broadcast {bare:.3f} s",
              flush=True)

    steps_s: dict[str, float] = {}
    if a.real_steps > 0:
        for code in a.code or [REPO]:
            run = real_run(code.resolve(), a.real_steps, a.seed, a.overrides)
            rows = run["rows"]
            med = {k: _med(rows, f"timing/{k}_s") for k in (*STAGES, "step")}
            med = {k: v for k, v in med.items() if v == v or k == "step"}  # stages the recipe does not use: absent
            other = med["step"] - sum(med[k] for k in STAGES if k in med)
            send = _med(rows, "sync/send_seconds")
            steps_s[str(code)] = med["step"]
            report.setdefault("real", []).append(run)
            print(f"\nreal loop, {code} ({a.real_steps} steps, medians of steps 2..; run wall {run['wall_s']:.0f} s, "
                  f"{run['console_lines']} console lines):", flush=True)
            print("  " + ", ".join(f"{k} {med[k]:.2f} s" for k in (*STAGES, "step") if k in med)
                  + f"; controller + Ray {other:.2f} s ({other / med['step']:.1%} of the step; goal <= 5%)")
            print(f"  sync: transfer {send:.2f} s, engine reload + probe {med['sync'] - send:.2f} s; rollout "
                  f"{_med(rows, 'rollout/tokens_per_s'):.0f} tokens/s")
            t = 0.0
            curve = []
            for x in rows:
                t += x["timing/step_s"]
                curve.append(f"{x['reward/mean']:.3f}@{t:.0f}s")
            print("  reward against wall-clock (step time summed, start-up excluded): " + " ".join(curve))
            table.append((f"step, {code.name or code} (s)", f"{med['step']:.1f}", "", "", ""))
            table.append((f"controller + Ray, {code.name or code} (share)", f"{other / med['step']:.1%}", "", "",
                          "<= 5%"))  # fmt: skip

    if a.trl:
        rows = trl_run(a.trl, max(a.real_steps, 2), a.seed, _resolved_dtype(r))
        trl_step = statistics.median(x["step_s"] for x in rows[1:] or rows)
        report["trl"] = rows
        print(f"\nTRL GRPOTrainer: step {trl_step:.1f} s (median), rewards "
              + " ".join(f"{x['reward_mean']:.3f}" for x in rows), flush=True)
        for code, s in steps_s.items():
            table.append((f"step vs TRL, {Path(code).name}", f"{s:.1f}", f"{trl_step:.1f} (TRL)", _ratio(s, trl_step),
                          "<= 0.5"))  # fmt: skip

    print(f"\n{'stage':<40} {'rlvr':>9} {'bare':>14} {'ratio':>6} {'goal':>7}")
    for row in table:
        print(f"{row[0]:<40} {row[1]:>9} {row[2]:>14} {row[3]:>6} {row[4]:>7}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
