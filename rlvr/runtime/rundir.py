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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlvr.config import Recipe

log = logging.getLogger("rlvr")

FAILED = "FAILED"
"""Written when a run raises: the error, the step reached and what to do (a text file)."""
RUNNING = "RUNNING"
"""Present while a run's process works in the folder: ``pid host start-time``."""
START_FILES = ("recipe.yaml", "derived.json", "train.log", "metrics.jsonl", "samples.jsonl", "timeline.jsonl",
               "validation.jsonl", "dph_buffer.pt", FAILED, RUNNING)  # fmt: skip
"""Files a run may have written before its first step completed (step-0 validation included)."""
STEP_LOGS = ("metrics.jsonl", "samples.jsonl", "timeline.jsonl", "validation.jsonl")
"""The run folder's files of one row per step (a ``step`` key): trimmed to a resumed checkpoint's step."""
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


def prepare_run_dir(recipe: Recipe) -> Path:
    """Create ``output_dir/name`` (``name-2``, ``name-3``... if it holds a run that completed a step or is running,
    with a warning; a folder whose run never completed a step is reused: :func:`rlvr.runtime.rundir.fresh_run_dir`)
    and write the resolved recipe.

    Resuming (``run.resume``) continues in the run folder itself: ``output_dir/name`` for ``auto``, the folder
    that holds the checkpoint (``RUN/checkpoints/step_N``) for a path. Its ``recipe.yaml`` is rewritten only once
    the checkpoint has been found compatible (in :func:`train`), so a refused resume leaves the folder as it was.
    Errors: ``FileNotFoundError``/``ValueError`` (from :func:`rlvr.runtime.checkpoint.resolve_resume`) for a
    resume path that is not a complete checkpoint; nothing is created then.
    """
    base = Path(recipe.run.output_dir) / recipe.run.name
    resume = recipe.run.resume
    if resume:
        from rlvr.runtime.checkpoint import resolve_resume

        ck = Path(resume).expanduser()
        run_dir = base if resume == "auto" else (ck.parent.parent if ck.parent.name == "checkpoints" else ck)
        if resume != "auto":
            resolve_resume(resume, run_dir)  # a bad path fails here, before any folder is made
        fresh = not (run_dir / "recipe.yaml").exists()
        run_dir.mkdir(parents=True, exist_ok=True)
        if not fresh:
            return run_dir
    else:
        run_dir = fresh_run_dir(base)
    write_recipe(recipe, run_dir)
    return run_dir


def write_recipe(recipe: Recipe, run_dir: Path) -> None:
    """``RUN/recipe.yaml`` (the resolved recipe) and ``RUN/derived.json`` (its derived sizes)."""
    from rlvr.config import dump_yaml

    (run_dir / "recipe.yaml").write_text(dump_yaml(recipe))
    (run_dir / "derived.json").write_text(json.dumps(recipe.derived(), indent=2))


def trim_metrics(path: Path, last_step: int) -> None:
    """Drop rows logged after ``last_step`` (a crashed run went on past its checkpoint; those steps run again)."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in keep))


def resume_point(r: Recipe, run_dir: Path, fingerprint: dict) -> tuple[Path | None, Any]:
    """(checkpoint to resume from, its controller state), or (None, None) for a fresh start; the recipe is written
    to the run folder either way. Errors: :class:`~rlvr.config.RecipeError` when the checkpoint's recipe or data
    differ from this run's."""
    from rlvr.runtime import checkpoint as ck

    resume_from = ck.resolve_resume(r.run.resume, run_dir) if r.run.resume else None
    if r.run.resume and resume_from is None:
        write_recipe(r, run_dir)  # --resume auto with nothing to resume: a fresh start in this folder
        for name in STEP_LOGS:
            trim_metrics(run_dir / name, 0)  # the steps a failed run logged before any checkpoint run again
    state = None
    if resume_from is not None:
        ck.check_compatible(resume_from, r, fingerprint)  # before anything expensive starts
        write_recipe(r, run_dir)  # compatible: the folder's recipe is now this one (e.g. more steps)
        state = ck.load_controller(resume_from)
        log.info("resuming from %s: step %d done, %d to go", resume_from, state.step, r.run.steps - state.step)
        for key, old, new in ck.optimizer_changes(resume_from, r):  # applied once the optimizer state is loaded
            log.info("resume changes %s: %s -> %s from step %d on (Adam's moments and step count are the "
                     "checkpoint's)", key, old, new, state.step + 1)
        for key, old, new in ck.changed_keys(resume_from, r, ck.DRAW_KEYS):
            log.warning("resume changes %s: %s -> %s: the engines split each batch otherwise, so from step %d on the "
                        "rollouts differ from an uninterrupted run's (valid, not identical)", key, old, new,
                        state.step + 1)
        for name in STEP_LOGS:
            trim_metrics(run_dir / name, state.step)
    ck.prune(run_dir, r.checkpoint.keep_last, r.checkpoint.best_metric, r.checkpoint.best_mode)  # crash leftovers
    return resume_from, state


@contextmanager
def run_log(run_dir: Path) -> Iterator[None]:
    """Within the block, the root logger's records (INFO and up) are appended to ``RUN/train.log`` too, without
    ANSI colour codes (Ray's and vLLM's texts carry them). Nested blocks on one folder (``rlvr train`` around
    :func:`~rlvr.runtime.restarts.train_with_restarts` around each attempt's
    :func:`~rlvr.runtime.controller.train`) share one handler: each record once; the outermost removes it, so a
    later run in this process does not write into this one's log."""
    from rlvr.console import LOG_FORMAT, PlainFormatter

    root, path = logging.getLogger(), str((run_dir / "train.log").resolve())
    if any(isinstance(h, logging.FileHandler) and h.baseFilename == path for h in root.handlers):
        yield
        return
    h = logging.FileHandler(path)
    h.setFormatter(PlainFormatter(LOG_FORMAT))
    root.addHandler(h)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(h)
        h.close()
