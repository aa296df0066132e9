"""Command line: ``rlvr train RECIPE.yaml [section.key=value ...] [--dry-run]``, ``rlvr model NAME`` and
``rlvr verify FILE.jsonl --verifier NAME`` (:mod:`rlvr.verify_cli`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def _flow(value) -> str:
    """``value`` as one line of YAML, as a recipe or a dotted override writes it (``[1, 2]``, ``{name: math}``)."""
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False).strip().removesuffix("\n...")


def _print_recipe(recipe, whole: bool) -> None:
    """The recipe at the start of ``rlvr train``: all of it (``whole``: ``--dry-run``, ``RLVR_CONSOLE=all``) or
    the keys that differ from the defaults (:func:`rlvr.recipe.non_default_keys`); then the derived sizes."""
    from rlvr.config import dump_yaml
    from rlvr.recipe import non_default_keys

    if whole:
        print("# resolved recipe")
        print(dump_yaml(recipe), end="")
    else:
        print("# recipe: the keys that differ from the defaults (the whole resolved recipe: recipe.yaml in the run "
              "folder; --dry-run prints it)")
        for k, v in non_default_keys(recipe).items():
            print(f"{k}: {_flow(v)}")
    print("# derived")
    for k, v in recipe.derived().items():
        print(f"#   {k}: {v}")
    sys.stdout.flush()


def cmd_train(args: argparse.Namespace) -> int:
    from rlvr.config import RecipeError
    from rlvr.console import show_all
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
    _print_recipe(recipe, whole=args.dry_run or show_all())
    from rlvr.runtime.checks import NOT_CHECKED, dry_run, preflight

    try:  # before anything starts or any folder is made; --dry-run also loads the data and builds the verifiers
        checked = dry_run(recipe) if args.dry_run else preflight(recipe)
    except (ValueError, KeyError, OSError, ImportError, AttributeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"rlvr train: {msg}", file=sys.stderr)
        return 2
    if args.dry_run:
        from rlvr.runtime.checks import memory_lines

        checked = checked + memory_lines(recipe)
        print("\n".join(checked))
        if any(line.startswith(NOT_CHECKED) for line in checked):
            print("dry run: recipe valid; what could not be checked here is marked 'not checked'; nothing started.")
        else:
            print("dry run: recipe valid; model context, data and verifiers checked: the run will start; "
                  "nothing started.")
        return 0
    from rlvr.runtime.controller import NonFiniteError, RunInterrupted, prepare_run_dir
    from rlvr.runtime.executors import RoleError
    from rlvr.runtime.restarts import train_with_restarts
    from rlvr.runtime.rundir import run_log
    from rlvr.sync.weights import WeightSyncError

    try:
        run_dir = prepare_run_dir(recipe)
    except (ValueError, OSError) as e:
        print(f"rlvr train: {e}", file=sys.stderr)
        return 2
    print(f"run folder: {run_dir} (the whole recipe in recipe.yaml, the whole log in train.log)")
    if not show_all():
        print("console: the roles' known third-party noise goes to train.log only "
              "(RLVR_CONSOLE=all or rlvr -v shows it)")
    sys.stdout.flush()
    import contextlib

    from rlvr.console import quiet_own_output

    # the local executor runs the roles in this process: vLLM's, torch's and DeepSpeed's C++ messages and progress
    # bars reach its own stderr, which only a file-descriptor filter sees (as rlvr eval does)
    quiet = quiet_own_output() if recipe.run.executor == "local" else contextlib.nullcontext()
    with run_log(run_dir):  # every attempt's log and the failure's traceback (below) in RUN/train.log
        try:
            with quiet:
                result = train_with_restarts(recipe, run_dir)
        except RunInterrupted as e:
            again = " ".join([args.recipe, *(o for o in args.overrides if not o.startswith("run.resume=")), "--resume auto"])
            print(f"rlvr train: stopped by {e.signame} after step {e.step}; checkpoint {e.checkpoint}\n"
                  f"continue with: rlvr train {again}", file=sys.stderr)
            return 143 if e.signame == "SIGTERM" else 130
        except (RecipeError, RoleError, WeightSyncError, NonFiniteError, ValueError, OSError, ImportError) as e:
            # the traceback goes to RUN/train.log only (rlvr.console.ConsoleFilter); the console gets one line
            logging.getLogger("rlvr").error("run failed", exc_info=True, extra={"console": False})
            from rlvr.console import for_stream
            from rlvr.runtime.rundir import failure_hint

            print(for_stream(f"rlvr train: the run failed: {type(e).__name__}: {e}\n(traceback in {run_dir / 'train.log'}; "
                             f"{run_dir / 'FAILED'} marks the folder)\n{failure_hint(run_dir)}", sys.stderr), file=sys.stderr)
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
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, and the whole console: every line of the roles' output and the whole "
                        "recipe at the start (as RLVR_CONSOLE=all)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train a policy with a recipe")
    p.add_argument("recipe", help="recipe YAML (see recipes/)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-6 run.steps=5")
    p.add_argument("--dry-run", action="store_true", help="check the recipe, the model's context (its config and "
                   "tokenizer, no weights), the data (rows, golds, prompt lengths) and the verifiers (built), print "
                   "what was checked, then stop; starts no role")
    p.add_argument("--resume", metavar="auto|PATH", help="continue from a checkpoint: auto = the newest complete one "
                   "of the run folder output_dir/name (a fresh start if none), or a RUN/checkpoints/step_N folder")
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("model", help="resolve (and for embedded models, build once) a model; print its folder")
    p.add_argument("name", help="smollm2-135m-instruct, tiny-random, a local folder or a hub id")
    p.set_defaults(fn=cmd_model)
    from rlvr.plot import add_plot_parser
    from rlvr.verify_cli import add_verify_parser

    add_verify_parser(sub)  # rlvr verify FILE.jsonl --verifier NAME (rlvr/verify_cli.py)
    from rlvr.eval_cli import add_eval_parser

    add_eval_parser(sub)  # rlvr eval MODEL --data SET ... (rlvr/eval_cli.py)
    add_plot_parser(sub)  # rlvr plot RUN_DIR [--out DIR] (rlvr/plot.py)
    from rlvr.serve.cli import add_serve_parser

    add_serve_parser(sub)  # rlvr serve [--model M] [--full] (rlvr/serve/)
    # overrides may come before or after flags (`train r.yaml --dry-run a.b=1` and `train r.yaml a.b=1 --dry-run`)
    args, extra = parser.parse_known_args(argv)
    if extra:
        if args.command not in ("train", "serve") or any(x.startswith("-") or "=" not in x for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    from rlvr.console import CONSOLE_ENV, setup_console

    if args.verbose:
        os.environ[CONSOLE_ENV] = "all"
    setup_console(logging.DEBUG if args.verbose else logging.INFO)
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
