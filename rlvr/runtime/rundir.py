"""Run folders: the marks a run leaves in ``output_dir/name`` and which folder a new run writes.

While :func:`rlvr.runtime.controller.train` runs, ``RUN/RUNNING`` holds its process id, host and start time; when
it raises, ``RUN/FAILED`` says when, after which step, the error and what to do next (:func:`marked`). A folder
whose run never completed a step (no metrics line of step >= 1, no complete checkpoint), whose run is not alive,
and which holds nothing but what a start writes (:data:`START_FILES`, :data:`START_DIRS`) is reused by the next
run of that name instead of making ``name-2`` (:func:`fresh_run_dir`): its earlier start's outputs are removed,
its ``train.log`` is kept (the new run appends to it).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("rlvr")

FAILED = "FAILED"
"""Written when a run raises: the error, the step reached and what to do (a text file)."""
RUNNING = "RUNNING"
"""Present while a run's process works in the folder: ``pid host start-time``."""
START_FILES = ("recipe.yaml", "derived.json", "train.log", "metrics.jsonl", "samples.jsonl", "timeline.jsonl",
               "validation.jsonl", "dph_buffer.pt", FAILED, RUNNING)  # fmt: skip
"""Files a run may have written before its first step completed (step-0 validation included)."""
START_DIRS = ("checkpoints", "tensorboard", "wandb", "mlruns")
"""Folders a run may have made before its first step completed (the metrics backends', incomplete checkpoints)."""


def steps_done(run_dir: str | Path) -> int:
    """The last step ``run_dir``'s run completed: the highest step >= 1 in ``metrics.jsonl`` or of a complete
    checkpoint; 0 when there is none."""
    from rlvr.runtime.checkpoint import checkpoint_step, latest_complete

    run_dir = Path(run_dir)
    done = 0
    ckpt = latest_complete(run_dir)
    if ckpt is not None:
        done = checkpoint_step(ckpt)
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        with open(metrics, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    step = json.loads(line).get("step", 0)
                except (ValueError, AttributeError):
                    continue
                if isinstance(step, (int, float)) and step > done:
                    done = int(step)
    return done


def live_run(run_dir: str | Path) -> str | None:
    """``pid N on HOST`` of the run working in ``run_dir`` now (its :data:`RUNNING` mark, the process alive, or
    on another host, where rlvr cannot tell), or None."""
    mark = Path(run_dir) / RUNNING
    try:
        pid_s, host = mark.read_text().split()[:2]
        pid = int(pid_s)
    except (OSError, ValueError):
        return None
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None  # died without clearing its mark (SIGKILL, OOM)
        except PermissionError:
            pass  # alive, another user's
    return f"pid {pid} on {host}"


def never_started(run_dir: str | Path) -> bool:
    """True when ``run_dir`` may be reused: no step completed there, no run alive in it, and nothing in it but
    what a start writes (:data:`START_FILES`, :data:`START_DIRS`)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or steps_done(run_dir) or live_run(run_dir):
        return False
    return all(p.name in (START_DIRS if p.is_dir() else START_FILES) for p in run_dir.iterdir())


def fresh_run_dir(base: Path) -> Path:
    """The folder a new (not resumed) run of ``base`` (``output_dir/name``) writes: ``base``, else ``base-2``,
    ``base-3`` ... : the first that does not exist or whose run never started (:func:`never_started`: reused,
    its earlier outputs removed, said in the log). Going past ``base`` is a warning naming why."""
    run_dir, i = base, 1
    while run_dir.exists() and not never_started(run_dir):
        i += 1
        run_dir = base.with_name(f"{base.name}-{i}")
    if run_dir != base:
        live = live_run(base)
        why = (f"a run is working in it ({live}; wait for it, or stop it)" if live else
               f"its run completed {steps_done(base)} step(s) (to continue {base} instead, add --resume auto)")
        log.warning("%s exists: this run writes %s; %s", base, run_dir, why)
    if run_dir.exists():
        failed = (run_dir / FAILED).read_text().splitlines()[0] if (run_dir / FAILED).is_file() else "no mark"
        log.info("%s: its earlier start never completed a step (%s): reusing the folder", run_dir, failed)
        clear_start(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def clear_start(run_dir: Path) -> None:
    """Remove what an earlier start wrote in ``run_dir`` (all of :data:`START_FILES` and :data:`START_DIRS` but
    ``train.log``), so that nothing of it passes for the new run's (a DPH buffer of another model, a step-0
    validation)."""
    for p in run_dir.iterdir():
        if p.is_dir() and p.name in START_DIRS:
            shutil.rmtree(p)
        elif p.name in START_FILES and p.name != "train.log":
            p.unlink()


def failure_hint(run_dir: str | Path) -> str:
    """What to do after a failed run in ``run_dir``: continue from its last complete checkpoint, or rerun (no step
    completed: the next run of the recipe reuses the folder)."""
    from rlvr.runtime.checkpoint import latest_complete

    ckpt = latest_complete(run_dir)
    if ckpt is not None:
        return f"its last complete checkpoint is {ckpt}: continue from it with --resume auto (or --resume {ckpt})"
    if steps_done(run_dir):
        return f"no complete checkpoint in {run_dir} to continue from (checkpoint.every_steps): rerun to start over"
    return f"no step completed: fix the cause and rerun; the run reuses {run_dir} (nothing there to --resume)"


@contextmanager
def marked(run_dir: str | Path, clean: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Mark ``run_dir`` :data:`RUNNING` for the body (an earlier :data:`FAILED` mark removed); when the body raises
    anything but ``clean`` (a stop that saved a checkpoint), write :data:`FAILED`: the time, the step reached, the
    error (ANSI colour codes removed) and :func:`failure_hint`."""
    from rlvr.console import strip_ansi

    run_dir = Path(run_dir)
    (run_dir / FAILED).unlink(missing_ok=True)
    (run_dir / RUNNING).write_text(f"{os.getpid()} {socket.gethostname()} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
    try:
        yield
    except clean:
        raise
    except BaseException as e:
        done = steps_done(run_dir)
        when = f"after step {done}" if done else "before step 1 (no step completed)"
        text = (f"the run failed {time.strftime('%Y-%m-%d %H:%M:%S')} {when}: {type(e).__name__}: {e}\n"
                f"traceback: {run_dir / 'train.log'}\n{failure_hint(run_dir)}\n")
        try:
            (run_dir / FAILED).write_text(strip_ansi(text))
        except OSError as err:
            log.warning("could not mark %s as failed: %s", run_dir, err)
        raise
    finally:
        (run_dir / RUNNING).unlink(missing_ok=True)
