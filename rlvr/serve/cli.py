"""``rlvr serve``: its command-line options (:class:`rlvr.serve.server.ServeOptions`) and entry point."""

from __future__ import annotations

import argparse
import sys


def add_serve_parser(sub) -> None:
    """Add ``rlvr serve`` to the ``rlvr`` command's subparsers."""
    from rlvr.serve.server import ServeOptions

    d = ServeOptions()
    p = sub.add_parser("serve", help="serve the Tinker training API (tinker SDK, tinker-cookbook loops) on a local model",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       description="The Tinker training API on rlvr's trainer and engines (docs/serve.md).")
    p.add_argument("--model", default=d.model, help="the base model: an embedded one (smollm2-135m-instruct, "
                   "tiny-random), a local folder or a hub id")
    p.add_argument("--name", default=d.name, help="the name clients give as base_model; empty: the model's own, "
                   "e.g. HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument("--full", action="store_true", help="train every weight (full fine-tuning) instead of the LoRA "
                   "adapters a client asks for")
    p.add_argument("--host", default=d.host, help="address to listen on (127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=d.port, help="port to listen on")
    p.add_argument("--state-dir", default=d.state_dir, help="checkpoints (tinker://... paths) and role logs")
    p.add_argument("--max-context", type=int, default=d.max_context, help="longest sequence, in tokens, a model "
                   "samples or trains on")
    p.add_argument("--max-models", type=int, default=d.max_models, help="training models held at once")
    p.add_argument("--op-timeout-s", type=float, default=d.op_timeout_s, help="deadline of one operation and of a "
                   "model's start, seconds")
    p.add_argument("--session-timeout-s", type=float, default=d.session_timeout_s, help="a session silent for this "
                   "long has its models unloaded")
    p.add_argument("--api-key", default=d.api_key, help="require this key from clients; empty: any key")
    p.add_argument("overrides", nargs="*", default=[], help="recipe settings of each model's roles, e.g. trainer.backend=deepspeed "
                   "rollout.engine=hf model.dtype=float32 trainer.micro_batch_size=8")
    p.set_defaults(fn=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from rlvr.config import RecipeError
    from rlvr.serve.app import serve
    from rlvr.serve.server import ServeOptions

    given = {f.name: getattr(args, f.name) for f in fields(ServeOptions) if hasattr(args, f.name)}  # each flag's field
    opts = ServeOptions(**{**given, "overrides": tuple(args.overrides)})
    try:
        serve(opts)
    except RecipeError as e:
        print(f"rlvr serve: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
