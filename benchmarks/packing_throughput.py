"""Packed and token-budget micro-batches against today's padded ones, on real rollout batches (issue 40).

1. ``--collect DIR`` runs one step of each recipe (``smoke_cpu``, ``multiturn_cpu``, ``tools_cpu``: SmolLM2-135M,
   the recipe's own settings, local executor) and saves the batch its trainer got (``DIR/<recipe>.pt``: the
   :class:`rlvr.train.batch.TrainBatch`).
2. Then, on each saved batch, in one process, interleaved repeat by repeat (this machine drifts: medians, ratios):

   - padding share of the layout: today's (``trainer.micro_batch_size`` sequences, longest first, padded to the
     longest), packed with the same micro-batches, packed by a token budget (``--budget``);
   - :meth:`rlvr.train.policy.PolicyWorker.train_step` (the recipe's dtype, threads, algorithm) in each of the
     three: trainer tokens per second (real tokens of the batch / step time);
   - the limit: a bare forward and backward of the budget layout's micro-batches, packed as the trainer packs them,
     with nothing else (transformers' model, the output layer on response positions, their logprobs summed,
     ``backward``): tokens per second. (One row of a whole micro-batch, T = 4096, measured 2x slower than the
     trainer: under a mask on CPU attention scores every position against every other.)

    PYTHONPATH=. .venv/bin/python benchmarks/packing_throughput.py --collect /tmp/batches   # ~6 min
    PYTHONPATH=. .venv/bin/python benchmarks/packing_throughput.py --batches /tmp/batches --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = ("smoke_cpu", "multiturn_cpu", "tools_cpu")


def collect(out: Path, names: list[str]) -> None:
    import torch

    import rlvr.train.policy as policy
    from rlvr.recipe import load_recipe
    from rlvr.runtime.controller import train

    out.mkdir(parents=True, exist_ok=True)
    real = policy.PolicyWorker.train_step
    for name in names:
        def grab(self, batch, dph=None, _name=name):
            torch.save(batch, out / f"{_name}.pt")
            return real(self, batch, dph)

        policy.PolicyWorker.train_step = grab
        r = load_recipe(str(REPO / "recipes" / f"{name}.yaml"),
                        ["run.steps=1", "run.executor=local", f"run.output_dir={out / 'runs'}", "run.save_final=false",
                         "checkpoint.every_steps=0", "validation.every_steps=0"])  # fmt: skip
        t0 = time.perf_counter()
        train(r)
        print(f"{name}: batch saved ({time.perf_counter() - t0:.0f} s)", flush=True)
    policy.PolicyWorker.train_step = real


def layouts(batch, rows: int, budget: int) -> dict[str, tuple[int, int, list[list[int]]]]:
    """(real tokens, computed tokens, micro-batches) of today's, packed and budget layouts."""
    import torch

    from rlvr.train.packing import forward_inputs, micro_batches

    lengths = batch.attention_mask.sum(1).tolist()
    order = torch.sort(torch.tensor(lengths), descending=True, stable=True).indices.tolist()
    by_rows = [order[k : k + rows] for k in range(0, len(order), rows)]
    by_tokens = micro_batches(order, lengths, budget, packed=True)
    out = {}
    for name, groups, packed in (("padded", by_rows, False), ("packed", by_rows, True),
                                 ("packed+budget", by_tokens, True)):  # fmt: skip
        computed = 0
        for g in groups:
            mb = batch.select(g)
            computed += forward_inputs(mb.input_ids, mb.attention_mask, packed).computed
        out[name] = (sum(lengths), computed, groups)
    return out


def bare_step(model, batch, groups, amp: bool) -> float:
    """Seconds of a forward and backward of the same micro-batches laid out as the packed trainer lays them (rows
    of :func:`rlvr.train.packing.row_layout`), with nothing else: the output layer on response positions, their
    logprobs summed, ``backward``. The trainer's work without its loss, statistics, copies and checks."""
    import torch

    from rlvr.train.packing import forward_inputs

    t0 = time.perf_counter()
    for g in groups:
        mb = batch.select(g)
        inputs = forward_inputs(mb.input_ids, mb.attention_mask, packed=True)
        at = inputs.index[mb.loss_mask.bool()]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):  # as the trainer's model.dtype
            hidden = model.model(**inputs.kwargs, use_cache=False).last_hidden_state.flatten(0, 1)[at]
            logits = model.lm_head(hidden)
        targets = mb.input_ids[:, 1:][mb.loss_mask.bool()]
        lp = torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None]).sum()
        lp.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def measure(batches: Path, names: list[str], repeats: int, budget: int) -> None:
    import torch

    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe
    from rlvr.train.policy import PolicyWorker

    for name in names:
        batch = torch.load(batches / f"{name}.pt", weights_only=False)
        base = ["run.executor=local", "trainer.backend=torch"]
        r0 = load_recipe(str(REPO / "recipes" / f"{name}.yaml"), base)
        model_dir = resolve_model(r0.model.path)
        lay = layouts(batch, r0.trainer.micro_batch_size, budget)
        real = lay["padded"][0]
        configs = {"padded": ["trainer.packing=false"], "packed": ["trainer.packing=true"],
                   "packed+budget": ["trainer.packing=true", f"trainer.max_tokens_per_micro_batch={budget}"]}
        workers = {k: PolicyWorker(load_recipe(str(REPO / "recipes" / f"{name}.yaml"), base + v), model_dir, 0, 1,
                                   "127.0.0.1", 0) for k, v in configs.items()}  # fmt: skip
        bare = workers["padded"].module  # the same weights class; its own gradients, zeroed after
        amp = workers["padded"].amp_dtype is not None
        times: dict[str, list[float]] = {k: [] for k in [*configs, "bare"]}
        for _ in range(repeats):
            for k, w in workers.items():
                t0 = time.perf_counter()
                w.train_step(batch)
                times[k].append(time.perf_counter() - t0)
            times["bare"].append(bare_step(bare, batch, lay["packed+budget"][2], amp))
        med = {k: statistics.median(v) for k, v in times.items()}
        lengths = batch.attention_mask.sum(1)
        print(f"\n{name}: {len(batch)} sequences, {real} tokens (lengths {int(lengths.min())}-{int(lengths.max())}, "
              f"median {int(lengths.median())}), micro-batch {r0.trainer.micro_batch_size} rows / budget {budget}, "
              f"dtype {r0.model.dtype}, medians of {repeats}")
        print("| layout | micro-batches | computed tokens | padding | step s | tokens/s | vs padded | vs bare |")
        print("|---|---|---|---|---|---|---|---|")
        for k in (*configs, "bare"):
            real_k, comp, groups = lay.get(k, lay["packed+budget"])  # bare: the budget layout's micro-batches
            pad = 1 - real_k / comp
            print(f"| {k} | {len(groups)} | {comp} | {pad:.1%} | {med[k]:.2f} | {real / med[k]:.0f} | "
                  f"{med['padded'] / med[k]:.2f}x | {med['bare'] / med[k]:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collect", type=Path)
    ap.add_argument("--batches", type=Path)
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=int, default=4096)
    a = ap.parse_args()
    names = a.recipes.split(",")
    if a.collect:
        collect(a.collect, names)
    if a.batches:
        measure(a.batches, names, a.repeats, a.budget)


if __name__ == "__main__":
    main()
