"""What asynchronous rollout (``rollout.max_staleness``) buys: the pipeline alone, then the real loop (issue 13).

Part 1, the pipeline alone: the real controller (:func:`rlvr.runtime.controller.train`, the real in-process
executor and :class:`rlvr.runtime.roles.Roles`) drives fake roles that hold no CPU -- the engine's ``generate``,
the trainer's ``train_step`` and the engine's ``receive_weights`` sleep for given stage times
(``tests/unit/loop_fakes.py``). Two profiles: this machine's measured smoke step (rollout 9 s, train 35 s, sync
1.3 s) and a GPU-like one where generation is 80% of the step (8 s, 2 s, 0.2 s), both scaled by ``--scale``.
The goal: the N = 1 step at most max(rollout, train) + sync + 5%, against rollout + train + sync for N = 0.
Medians over the steps after the first.

Part 1b, uneven generation (every fourth batch 9x longer: 1, 1, 1, 9 against an update of 3, x ``--scale``):
N = 0 and N = 1, the sum of step times, against N = 1's bound (the sum over steps of max(rollout, train)) and the
bound of a pipeline that kept several generations in flight (max(sum of rollouts, sum of updates)), the slack an
N > 1 would have to buy. rlvr refuses N > 1: its sync needs idle engines, so one generation is ever in flight (an
N = 2 measured before the refusal ran 5.98 s against N = 1's 5.44 s at scale 0.1, 12 steps; the bound 3.6 s).

Part 1c, long-tail generation on a GPU-like engine, in flight (issue 39): the real controller and local executor
drive fake roles whose engine is ``loop_fakes.SlotEngine``, a continuous-batching engine on a simulated clock: C
slots (C = a batch's 16 x 4 samples), one token per running sample per decode step (8 s x ``--scale`` / 128 tokens
of wall time), 90% of samples 16 tokens and 10% 128 (the coin seeded per sample: every mode draws the same batches).
Lock-step (today's vLLM ``LLM.generate``) runs one call's samples alone and loads weights between calls; in flight
(``rollout.in_flight_updates``) a free slot takes the next waiting sample of any batch and a weight load (0.2 s x
``--scale``, nothing decodes meanwhile) lands between two decode steps, the tokens after it labelled with the new
version. The update sleeps ``--tail-train`` x a batch's generation work on full slots (mean length x step:
generation is then ~80% of the synchronous step, as in part 1's GPU-like profile). Modes: synchronous (N = 0), N = 1
lock-step, in flight N = 1, 2, 4 (and 8, beyond the issue's list). Per mode, over the steps after the warm-up and
before the last (which drains the batches in flight before its sync): the median and mean step time, the bound
(perfect overlap: max(update + load, work on full slots + load); lock-step: max(longest sample, update) + load; in
flight N also (longest + update + load) / (N + 1), as a batch is submitted N steps before the step that waits for
it), the speed-up over synchronous (means: in flight, steps alternate between waiting for a long sample and taking a
batch already done), the engine idle share (1 - busy slot-steps / (C x the decode steps the window's wall time
holds), weight loads counted idle), the share of time with no sample in a slot, the run's own engine idle
(``roles/engines_idle_s``: time with no engine call open, blind to idle slots), and the medians of
``async/spanning_frac`` and ``async/token_staleness_mean``.
Goal (issue 39): >= 1.7x over synchronous with engines idle < 10%.

Part 2, the real loop on this machine (``--real-steps K``, 0 skips it): ``recipes/smoke_cpu.yaml`` for K steps
(validation and sample tables off) with N = 0, with N = 1 on the same threads, and with N = 1 and the two cores
split (engine on core 0, trainer on core 1, one thread each: ``rollout.cpus``, ``trainer.cpus``). Per run: the
medians of step, rollout, train and sync seconds, each role's idle share and the overlap share
(``roles/*``, ``rlvr.metrics.timeline``), the reward per step, and the step-time ratio to N = 0.

    .venv/bin/python benchmarks/async_speedup.py --real-steps 5      # ~25 min on 2 cores; --real-steps 0: ~2 min
    .venv/bin/python benchmarks/async_speedup.py --parts 1c          # part 1c alone: ~1.5 min
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "unit"))  # the fake roles

PROFILES = {  # name -> (rollout, train, sync) seconds
    "this CPU (smoke step)": (9.0, 35.0, 1.3),
    "GPU-like (rollout 80%)": (8.0, 2.0, 0.2),
}
TAIL = dict(short=16, long_mult=8, long_frac=0.1)  # the length mix of part 1c: tokens, x, share of samples
TAIL_TIMES = (8.0, 0.2)  # seconds (x --scale): the longest sample's generation, a weight load (part 1's GPU-like)
TAIL_PROMPTS, TAIL_G = 16, 4  # a batch: prompts x samples (= the engine's slots)
TAIL_MODES = {  # name -> (rollout.max_staleness, rollout.in_flight_updates)
    "synchronous": (0, False),
    "N=1 lock-step (today)": (1, False),
    "in flight N=1": (1, True),
    "in flight N=2": (2, True),
    "in flight N=4": (4, True),
    "in flight N=8": (8, True),  # beyond issue 39's list: how deep the pipeline must be for idle < 10% here
}
REAL = {  # name -> overrides
    "N=0": ["rollout.max_staleness=0"],
    "N=1": ["rollout.max_staleness=1"],
    "N=1, cores split": ["rollout.max_staleness=1", "rollout.cpus=[0]", "trainer.cpus=[1]", "rollout.threads=1",
                         "trainer.threads=1"],
    "in flight N=1, cores split": ["rollout.max_staleness=1", "rollout.in_flight_updates=true", "rollout.cpus=[0]",
                                   "trainer.cpus=[1]", "rollout.threads=1", "trainer.threads=1"],
    "in flight N=2, cores split": ["rollout.max_staleness=2", "rollout.in_flight_updates=true", "rollout.cpus=[0]",
                                   "trainer.cpus=[1]", "rollout.threads=1", "trainer.threads=1"],
}  # fmt: skip
REAL_ONLY = ()  # --real-modes: a subset of REAL by name


def _rows(run_dir: str | Path) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _median(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else float("nan")


def pipeline(scale: float, steps: int, out: Path) -> None:
    from loop_fakes import FakeExecutor

    from rlvr.metrics import names as mn
    from rlvr.recipe import load_recipe
    from rlvr.runtime.controller import train

    print(f"## Part 1: the pipeline alone (fake roles that sleep; stage times x {scale}; {steps} steps; "
          "medians of steps 2..)\n")
    print("| profile | N | step s | rollout + train + sync | max(rollout, train) + sync | step / bound | "
          "engine idle | trainer idle | overlap |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (ro, tr, sy) in PROFILES.items():
        ro, tr, sy = ro * scale, tr * scale, sy * scale
        for n in (0, 1):
            ex = FakeExecutor(generate_s=ro, train_s=tr, sync_s=sy)
            r = load_recipe(str(REPO / "recipes" / "tiny_test.yaml"), [
                f"run.output_dir={out}", f"run.name=pipe-{n}-{ro}", "run.executor=local", f"run.steps={steps}",
                "run.save_final=false", "checkpoint.every_steps=0", "sync.probe_every=0", "metrics.progress=false",
                f"rollout.max_staleness={n}"])  # fmt: skip
            rows = _rows(train(r, executor=ex).run_dir)[1:]
            step = _median(rows, mn.TIMING_STEP_S)
            serial, bound = ro + tr + sy, max(ro, tr) + sy
            idle = lambda g: _median(rows, mn.role_idle(g)) / step  # noqa: E731
            print(f"| {name} | {n} | {step:.3f} | {serial:.3f} | {bound:.3f} | {step / bound:.3f} | "
                  f"{idle('engines'):.0%} | {idle('trainer'):.0%} | {_median(rows, mn.ROLES_OVERLAP_FRAC):.0%} |")
    print()


def uneven(scale: float, steps: int, out: Path) -> None:
    from loop_fakes import FakeExecutor

    from rlvr.metrics import names as mn
    from rlvr.recipe import load_recipe
    from rlvr.runtime.controller import train

    gen, tr = tuple(x * scale for x in (1.0, 1.0, 1.0, 9.0)), 3.0 * scale
    per_step = [gen[i % len(gen)] for i in range(1, steps + 1)]  # batch s is generate call s (call 0: batch 1 ahead)
    print(f"## Part 1b: uneven generation ({', '.join(f'{x:.2f}' for x in gen)} s cycled, update {tr:.2f} s, "
          f"{steps} steps)\n")
    print("| N | sum of step s | N = 1 bound: sum max(rollout, train) | several in flight: max(sums) |")
    print("|---|---|---|---|")
    for n in (0, 1):
        ex = FakeExecutor(generate_s=gen, train_s=tr)
        r = load_recipe(str(REPO / "recipes" / "tiny_test.yaml"), [
            f"run.output_dir={out}", f"run.name=uneven-{n}", "run.executor=local", f"run.steps={steps}",
            "run.save_final=false", "checkpoint.every_steps=0", "sync.probe_every=0", "metrics.progress=false",
            f"rollout.max_staleness={n}"])  # fmt: skip
        total = sum(x[mn.TIMING_STEP_S] for x in _rows(train(r, executor=ex).run_dir))
        print(f"| {n} | {total:.2f} | {sum(max(g, tr) for g in per_step):.2f} | "
              f"{max(sum(per_step), tr * steps):.2f} |")
    print()


def long_tail(scale: float, steps: int, out: Path, train_frac: float = 1.0, warmup: int = 8) -> None:
    """Part 1c (see the module docstring): one run per mode of :data:`TAIL_MODES`, the same batches (the length coin
    is seeded per sample), medians over the steps after ``warmup`` and before the last (whose drain is not typical)."""
    from loop_fakes import FakeExecutor

    from rlvr.metrics import names as mn
    from rlvr.recipe import load_recipe
    from rlvr.runtime.controller import train

    short, mult, frac = TAIL["short"], TAIL["long_mult"], TAIL["long_frac"]
    longest_s, load_s = TAIL_TIMES[0] * scale, TAIL_TIMES[1] * scale
    dt = longest_s / (short * mult)  # s per decode step: the longest sample takes longest_s
    slots = TAIL_PROMPTS * TAIL_G
    mean_len = short * (1 - frac + frac * mult)
    train_s = train_frac * mean_len * dt  # the batch's generation work on full slots, times train_frac
    load_ticks = round(load_s / dt)
    print(f"## Part 1c: long-tail generation on a continuous-batching engine ({TAIL_PROMPTS} x {TAIL_G} samples, "
          f"{slots} slots, {1 - frac:.0%} of samples {short} tokens and {frac:.0%} {short * mult}; a decode step "
          f"{dt * 1e3:.2f} ms; update {train_s:.3f} s = {train_frac:g} x the batch's work on full slots "
          f"(mean length {mean_len:.1f} x step); weight load {load_ticks} steps = {load_ticks * dt:.3f} s; {steps} "
          f"steps, medians of steps {warmup + 1}..{steps - 1})\n")
    results = {}
    for name, (n, in_flight) in TAIL_MODES.items():
        ex = FakeExecutor(train_s=train_s, sync_s=load_ticks * dt,
                          slot_engine=dict(slots=slots, dt_s=dt, short=short, long_mult=mult, long_frac=frac))
        tag = "".join(c for c in name if c.isalnum())
        r = load_recipe(str(REPO / "recipes" / "tiny_test.yaml"), [
            f"run.output_dir={out}", f"run.name=tail-{tag}", "run.executor=local", f"run.steps={steps}",
            "run.save_final=false", "checkpoint.every_steps=0", "sync.probe_every=0", "metrics.progress=false",
            f"rollout.prompts_per_step={TAIL_PROMPTS}", f"rollout.samples_per_prompt={TAIL_G}",
            f"rollout.max_new_tokens={short * mult}", f"rollout.max_staleness={n}",
            f"rollout.in_flight_updates={str(in_flight).lower()}"])  # fmt: skip
        rows = _rows(train(r, executor=ex).run_dir)
        eng = ex.objects["engine0"].result()
        window = [x for x in rows if warmup < x["step"] < steps]
        results[name] = (n, in_flight, window, eng.usage(warmup, steps - 1), eng.batches)
    # per batch, from the lengths drawn (the same in every mode): the longest sample, the tokens
    lengths = [[x.length for x in b.samples] for b in results["synchronous"][4]]
    longest = statistics.mean(max(b) for b in lengths) * dt
    work = statistics.mean(sum(b) for b in lengths) / slots * dt  # the batch on full slots
    load = load_ticks * dt
    mean = lambda rr: statistics.mean(x[mn.TIMING_STEP_S] for x in rr)  # noqa: E731
    base, serial = mean(results["synchronous"][2]), longest + train_s + load
    ideal = max(train_s + load, work + load)
    print(f"per batch: longest sample {longest:.3f} s, work on full slots {work:.3f} s; update {train_s:.3f} s, "
          f"load {load:.3f} s. Perfect overlap: max(update + load, work + load) = {ideal:.3f} s a step, "
          f"{serial / ideal:.2f}x over synchronous (longest + update + load = {serial:.3f} s). Bounds: lock-step "
          f"max(longest, update) + load; in flight N max(perfect overlap, (longest + update + load) / (N + 1)) (a "
          f"batch is submitted N steps before the step that waits for it)\n")
    print("| mode | step s (median) | step s (mean) | bound s | mean / bound | speed-up over synchronous (means) | "
          "engine idle (slot-steps) | no sample running | roles/engines_idle | spanning_frac | token_staleness_mean | "
          "dropped stale | clock rate |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, (n, in_flight, rr, use, _) in results.items():
        step = mean(rr)
        bound = (serial if n == 0 else max(longest, train_s) + load if not in_flight
                 else max(ideal, serial / (n + 1)))  # fmt: skip
        print(f"| {name} | {_median(rr, mn.TIMING_STEP_S):.3f} | {step:.3f} | {bound:.3f} | {step / bound:.2f} | "
              f"{base / step:.2f}x | {use['idle']:.0%} | {use['zero']:.0%} | "
              f"{statistics.mean(x[mn.role_idle('engines')] for x in rr) / step:.0%} | "
              f"{_median(rr, mn.ASYNC_SPANNING_FRAC):.2f} | {_median(rr, mn.ASYNC_TOKEN_STALENESS_MEAN):.2f} | "
              f"{sum(x[mn.ASYNC_DROPPED_STALE] for x in rr):.0f} | {use['clock_rate']:.2f} |")
    print()


def real(steps: int, out: Path) -> None:
    from rlvr.metrics import names as mn

    print(f"## Part 2: the real loop (recipes/smoke_cpu.yaml, {steps} steps, medians of steps 2..)\n")
    results = {}
    for name, extra in REAL.items():
        if REAL_ONLY and name not in REAL_ONLY:
            continue
        tag = name.replace(" ", "").replace(",", "_").replace("=", "")
        cmd = [sys.executable, "-m", "rlvr.cli", "train", str(REPO / "recipes" / "smoke_cpu.yaml"), f"run.steps={steps}",
               f"run.output_dir={out}", f"run.name={tag}", "validation.every_steps=0", "metrics.samples_every=0",
               "metrics.progress=false", "checkpoint.every_steps=0", *extra]  # fmt: skip
        print(f"running {name}: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if p.returncode:
            print(f"{name} failed (rc {p.returncode}):\n{p.stderr[-3000:]}", file=sys.stderr)
            continue
        results[name] = _rows(out / tag)
    if not results:
        return
    base = _median(results.get("N=0", [])[1:], mn.TIMING_STEP_S) if "N=0" in results else float("nan")
    print("| run | step s | rollout s | train s | sync s | engine idle | trainer idle | reward idle | overlap | "
          "step / N=0 | engine loop busy (in flight) | token lag | spanning |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        rr = rows[1:]
        step = _median(rr, mn.TIMING_STEP_S)
        idle = lambda g: _median(rr, mn.role_idle(g)) / step  # noqa: E731
        print(f"| {name} | {step:.1f} | {_median(rr, mn.TIMING_ROLLOUT_S):.1f} | {_median(rr, mn.TIMING_TRAIN_S):.1f} | "
              f"{_median(rr, mn.TIMING_SYNC_S):.1f} | {idle('engines'):.0%} | {idle('trainer'):.0%} | "
              f"{idle('reward'):.0%} | {_median(rr, mn.ROLES_OVERLAP_FRAC):.0%} | {step / base:.2f} | "
              f"{_median(rr, mn.ASYNC_ENGINE_BUSY_FRAC):.0%} | {_median(rr, mn.ASYNC_TOKEN_STALENESS_MEAN):.2f} | "
              f"{_median(rr, mn.ASYNC_SPANNING_FRAC):.2f} |")
    print("\nreward/mean per step (same seed):\n")
    for name, rows in results.items():
        print(f"- {name}: " + " ".join(f"{r[mn.REWARD_MEAN]:.3f}" for r in rows) +
              f"  (lag {' '.join(str(int(r[mn.ASYNC_STALENESS_MAX])) for r in rows)})")
    print(f"\nrun folders: {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=0.1, help="multiplies the fake stage times (default 0.1)")
    ap.add_argument("--steps", type=int, default=6, help="steps per pipeline run (default 6)")
    ap.add_argument("--real-steps", type=int, default=5, help="steps per real smoke run (0: skip part 2)")
    ap.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    ap.add_argument("--parts", default="1,1b,1c,2", help="which parts to run (default: 1,1b,1c,2)")
    ap.add_argument("--tail-steps", type=int, default=24, help="steps per part 1c run (default 24)")
    ap.add_argument("--tail-train", type=float, default=1.0,
                    help="part 1c's update time as a multiple of a batch's generation work on full slots (default 1)")
    ap.add_argument("--real-modes", nargs="*", default=(), help="part 2: only these runs of REAL (by name)")
    a = ap.parse_args()
    global REAL_ONLY
    REAL_ONLY = tuple(a.real_modes)
    out = a.out or Path(tempfile.mkdtemp(prefix="rlvr-async-"))
    parts = set(a.parts.split(","))
    if "1" in parts:
        pipeline(a.scale, a.steps, out)
    if "1b" in parts:
        uneven(a.scale, 2 * a.steps, out)
    if "1c" in parts:
        long_tail(a.scale, a.tail_steps, out, a.tail_train)
    if "2" not in parts:
        return
    if a.real_steps:
        real(a.real_steps, out)


if __name__ == "__main__":
    main()
