"""In-flight weight updates on real engines (issue 39): the trainer-vs-behaviour logprob gap by token age.

The real loop (vLLM on CPU, the verifier pool, the torch trainer, the checked weight sync) on the ``tiny-random``
model (fp32, so a token sampled and scored by the same weights has a gap of 0 up to kernel differences), learning
fast (lr 1e-2: each update moves the policy a visible amount) on long samples (``rollout.max_new_tokens`` 96, so
updates land mid-request). Modes, each ``--steps`` steps in one run of this script:

- ``lock-step N=1``: today's one-step-off loop (the sync waits for idle engines; no sample spans an update);
- ``in-flight N=1, 2, 3``: ``rollout.in_flight_updates`` with ``rollout.max_staleness`` N, ``in_flight_kv: keep``;
- ``in-flight N=2 recompute``: the same with ``in_flight_kv: recompute``;
- ``in-flight N=2 (Ray)``: under the Ray executor (each role its own process).

Per mode, medians over the steps after the first N + 1 (the pipeline full): ``train/rollout_gap_abs_age/<a>``
(nats, mean |trainer old logprob - engine logprob| over the tokens sampled a versions before the weights updated:
a = 0 is engine/trainer numerics plus, under ``keep``, the old weights' KV cache of a sample that spans an update),
``async/spanning_frac``, ``async/token_staleness_mean``, the step time and the engines' busy share of the step
(``roles/engines_busy_s`` over ``timing/step_s``: time with a generate call open).

    PYTHONPATH=. .venv/bin/python benchmarks/inflight_gap.py --steps 8      # ~6 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "recipes" / "tiny_test.yaml")
BASE = ["model.dtype=float32", "rollout.max_new_tokens=96", "rollout.prompts_per_step=8", "rollout.samples_per_prompt=4",
        "trainer.lr=1e-2", "run.save_final=false", "checkpoint.every_steps=0", "data.generated.size=400",
        "trainer.micro_batch_size=32"]  # fmt: skip
MODES = {
    "lock-step N=1": ["run.executor=local", "rollout.max_staleness=1"],
    "in-flight N=1": ["run.executor=local", "rollout.max_staleness=1", "rollout.in_flight_updates=true"],
    "in-flight N=2": ["run.executor=local", "rollout.max_staleness=2", "rollout.in_flight_updates=true"],
    "in-flight N=3": ["run.executor=local", "rollout.max_staleness=3", "rollout.in_flight_updates=true"],
    "in-flight N=2 recompute": ["run.executor=local", "rollout.max_staleness=2", "rollout.in_flight_updates=true",
                                "rollout.in_flight_kv=recompute"],
    "in-flight N=2 (Ray)": ["run.executor=ray", "run.num_cpus=2", "rollout.max_staleness=2",
                            "rollout.in_flight_updates=true"],
}  # fmt: skip


def _med(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else None


def run(name: str, overrides: list[str], steps: int, out: Path) -> dict:
    from rlvr.recipe import load_recipe
    from rlvr.runtime.controller import train

    n = int(next(o.split("=")[1] for o in overrides if o.startswith("rollout.max_staleness")))
    r = load_recipe(TINY, [*BASE, *overrides, f"run.steps={steps}", f"run.output_dir={out}",
                           f"run.name={name.replace(' ', '_').replace('=', '').replace('(', '').replace(')', '')}"])
    res = train(r)
    rows = [json.loads(x) for x in (Path(res.run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    full = [x for x in rows if x.get("step", 0) > n + 1] or rows
    ages = sorted({int(k.rsplit("/", 1)[1]) for x in full for k in x if k.startswith("train/rollout_gap_abs_age/")})
    busy = [x["roles/engines_busy_s"] / x["timing/step_s"] for x in full if "roles/engines_busy_s" in x]
    return {
        "gap": {a: _med(full, f"train/rollout_gap_abs_age/{a}") for a in ages},
        "tokens": {a: _med(full, f"async/token_staleness/{a}") for a in ages},
        "spanning": _med(full, "async/spanning_frac"),
        "token_lag": _med(full, "async/token_staleness_mean"),
        "step_s": _med(full, "timing/step_s"),
        "busy": statistics.median(busy) if busy else None,
        "reward": [round(x.get("reward/mean", float("nan")), 3) for x in rows],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--modes", nargs="*", default=list(MODES))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="inflight-gap-"))
    results = {m: run(m, MODES[m], a.steps, out) for m in a.modes}
    ages = sorted({k for v in results.values() for k in v["gap"]})
    print(f"\n{a.steps} steps a mode; medians over the steps after the first N + 1; gaps in nats (tokens: share)")
    head = "| mode | " + " | ".join(f"gap age {k} (tokens)" for k in ages) + " | spanning | token lag | step s | engines busy |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    fmt = lambda x, p=4: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    for m, v in results.items():
        cells = [f"{fmt(v['gap'].get(k))} ({fmt(v['tokens'].get(k), 2)})" for k in ages]
        print(f"| {m} | " + " | ".join(cells) + f" | {fmt(v['spanning'], 2)} | {fmt(v['token_lag'], 2)} | "
              f"{fmt(v['step_s'], 2)} | {fmt(v['busy'], 2)} |")
    for m, v in results.items():
        print(f"{m}: reward/mean by step {v['reward']}")
    (out / "inflight_gap.json").write_text(json.dumps(results, indent=1))
    print(f"(runs and inflight_gap.json in {out})")


if __name__ == "__main__":
    main()
