"""Command line: ``rlvr train RECIPE.yaml [section.key=value ...] [--dry-run]``, ``rlvr model NAME`` and
``rlvr verify FILE.jsonl --verifier NAME`` (:mod:`rlvr.verify_cli`)."""

from __future__ import annotations

import argparse
import logging
import sys


def _print_recipe(recipe) -> None:
    from rlvr.config import dump_yaml

    print("# resolved recipe")
    print(dump_yaml(recipe), end="")
    print("# derived")
    for k, v in recipe.derived().items():
        print(f"#   {k}: {v}")
    sys.stdout.flush()


def cmd_train(args: argparse.Namespace) -> int:
    from rlvr.config import RecipeError
    from rlvr.metrics import names as mn
    from rlvr.recipe import load_recipe

    if args.resume:
        args.overrides = list(args.overrides) + [f"run.resume={args.resume}"]
    try:
        recipe = load_recipe(args.recipe, args.overrides)
    except RecipeError as e:
        print(f"rlvr train: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"rlvr train: cannot read recipe file {args.recipe!r}: {e.strerror or e}", file=sys.stderr)
        return 2
    _print_recipe(recipe)
    from rlvr.runtime.controller import preflight

    try:
        preflight(recipe)  # verifier names, data files, model name: before anything starts or any folder is made
    except (ValueError, KeyError, OSError, ImportError, AttributeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"rlvr train: {msg}", file=sys.stderr)
        return 2
    if args.dry_run:
        print("dry run: recipe valid; nothing started.")
        return 0
    from rlvr.runtime.controller import NonFiniteError, RunInterrupted, prepare_run_dir, train
    from rlvr.runtime.executors import RoleError
    from rlvr.sync.weights import WeightSyncError

    try:
        run_dir = prepare_run_dir(recipe)
    except (ValueError, OSError) as e:
        print(f"rlvr train: {e}", file=sys.stderr)
        return 2
    print(f"run folder: {run_dir}", flush=True)
    try:
        result = train(recipe, run_dir)
    except RunInterrupted as e:
        again = " ".join([args.recipe, *(o for o in args.overrides if not o.startswith("run.resume=")), "--resume auto"])
        print(f"rlvr train: stopped by {e.signame} after step {e.step}; checkpoint {e.checkpoint}\n"
              f"continue with: rlvr train {again}", file=sys.stderr)
        return 143 if e.signame == "SIGTERM" else 130
    except (RecipeError, RoleError, WeightSyncError, NonFiniteError, ValueError, OSError, ImportError) as e:
        # the traceback goes to RUN/train.log only (the file handler); the console gets the one-line message
        record = logging.getLogger("rlvr").makeRecord("rlvr", logging.ERROR, __file__, 0, "run failed", (), sys.exc_info())
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.FileHandler):
                h.handle(record)
        print(f"rlvr train: the run failed: {type(e).__name__}: {e}\n(traceback in {run_dir / 'train.log'})", file=sys.stderr)
        return 1
    m = result.last_metrics
    keys = [mn.REWARD_MEAN] + [mn.passk(k) for k in recipe.pass_k] + [mn.SYNC_GBPS, mn.TIMING_STEP_S]
    print("final step: " + ", ".join(f"{k}={m[k]:.4g}" for k in keys if k in m))
    print(f"metrics: {run_dir / 'metrics.jsonl'}")
    if result.final_dir:
        print(f"final policy (Hugging Face format): {result.final_dir}")
    return 0


def cmd_model(args: argparse.Namespace) -> int:
    from rlvr.models import resolve_model

    try:
        print(resolve_model(args.name))
    except (ValueError, RuntimeError) as e:
        print(f"rlvr model: {e}", file=sys.stderr)
        return 2
    return 0



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlvr", description="RL post-training against verifiable rewards")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train a policy with a recipe")
    p.add_argument("recipe", help="recipe YAML (see recipes/)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-6 run.steps=5")
    p.add_argument("--dry-run", action="store_true", help="load, check and print the recipe, then stop")
    p.add_argument("--resume", metavar="auto|PATH", help="continue from a checkpoint: auto = the newest complete one "
                   "of the run folder output_dir/name (a fresh start if none), or a RUN/checkpoints/step_N folder")
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("model", help="resolve (and for embedded models, build once) a model; print its folder")
    p.add_argument("name", help="smollm2-135m-instruct, tiny-random, a local folder or a hub id")
    p.set_defaults(fn=cmd_model)
    from rlvr.plot import add_plot_parser
    from rlvr.verify_cli import add_verify_parser

    add_verify_parser(sub)  # rlvr verify FILE.jsonl --verifier NAME (rlvr/verify_cli.py)
    from rlvr.evaluate import add_eval_parser

    add_eval_parser(sub)  # rlvr eval MODEL --data SET ... (rlvr/evaluate.py)
    add_plot_parser(sub)  # rlvr plot RUN_DIR [--out DIR] (rlvr/plot.py)
    # overrides may come before or after flags (`train r.yaml --dry-run a.b=1` and `train r.yaml a.b=1 --dry-run`)
    args, extra = parser.parse_known_args(argv)
    if extra:
        if args.command != "train" or any(x.startswith("-") or "=" not in x for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
