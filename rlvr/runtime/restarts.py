"""A run that restarts itself (issue 41, ``run.max_restarts``): after a failure a restart can mend, the run goes
on from the newest complete checkpoint of its own folder, in this process, as ``--resume auto`` would.

Mendable (:func:`restart_cause`): a role's process died (:class:`~rlvr.runtime.executors.RoleError` with
``died``), a call overran its deadline (``timed_out``), a weight sync failed or timed out
(:class:`~rlvr.sync.weights.WeightSyncError`). Everything else ends the run at once: a recipe or data error, NaN
updates in a row, an exception a role's own code raised (it would raise again), a stop by Ctrl-C/SIGTERM. Each
restart is logged with its cause and the checkpoint it starts from; the folder keeps one ``metrics.jsonl`` row per
step (the rows after the checkpoint are dropped and redone, :func:`rlvr.runtime.rundir.resume_point`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.config import Recipe

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 300.0
"""The longest wait before a restart (the backoff doubles from ``run.restart_backoff_s``)."""


def restart_cause(e: BaseException) -> str | None:
    """Why a restart may mend the failure ``e`` (a few words), or None when it cannot."""
    from rlvr.runtime.executors import RoleError
    from rlvr.sync.weights import WeightSyncError

    if isinstance(e, RoleError) and e.died:
        return f"the {e.role or 'a'} role's process died"
    if isinstance(e, RoleError) and e.timed_out:
        return f"{e.role or 'a role'} overran its deadline"
    if isinstance(e, WeightSyncError):
        return "the weight sync failed"
    return None


def backoff_s(first_s: float, restart: int) -> float:
    """Seconds to wait before restart number ``restart`` (1-based): ``first_s`` x 2^(restart - 1), at most
    :data:`MAX_BACKOFF_S`."""
    return min(MAX_BACKOFF_S, first_s * 2 ** (restart - 1))


def train_with_restarts(recipe: Recipe, run_dir: Path, executors: Callable[[], Any] | None = None,
                        sleep: Callable[[float], None] = time.sleep) -> Any:
    """:func:`rlvr.runtime.controller.train` in ``run_dir``, restarted up to ``run.max_restarts`` times after a
    mendable failure (:func:`restart_cause`), each from the folder's newest complete checkpoint
    (``run.resume=auto``). ``executors``: a new executor for each attempt (None: the recipe's). Returns the
    :class:`~rlvr.runtime.controller.RunResult` of the attempt that finished; raises the failure that ended the run
    (a cause no restart mends, or the last one once the restarts are spent)."""
    from rlvr.runtime.checkpoint import latest_complete
    from rlvr.runtime.controller import train
    from rlvr.runtime.rundir import run_log

    with run_log(run_dir):  # the restarts' causes in RUN/train.log beside the attempts' own records
        return _attempts(recipe, run_dir, executors, sleep, train, latest_complete)


def _attempts(recipe: Recipe, run_dir: Path, executors: Callable[[], Any] | None, sleep: Callable[[float], None],
              train: Callable[..., Any], latest_complete: Callable[[Path], Any]) -> Any:
    from rlvr.runtime.controller import Standing

    r, restarts, standing = recipe, 0, Standing()
    try:
        while True:
            try:
                new_ex = executors() if executors is not None and standing.roles is None else None
                return train(r, run_dir, new_ex, standing)
            except Exception as e:
                cause = restart_cause(e)
                if cause is None or restarts >= recipe.run.max_restarts:
                    raise
                restarts += 1
                ck = latest_complete(run_dir)
                wait = backoff_s(recipe.run.restart_backoff_s, restarts)
                log.warning("the run failed (%s: %s: %s); restart %d of %d in %.0fs from %s%s", cause,
                            type(e).__name__, e, restarts, recipe.run.max_restarts, wait,
                            ck or "step 1 (no complete checkpoint yet)",
                            "; the engines and other roles are kept, the trainer group rebuilt" if standing.roles
                            else "")  # fmt: skip
                sleep(wait)
                r = dataclasses.replace(recipe, run=dataclasses.replace(recipe.run, resume="auto"))
    finally:
        if standing.roles is not None:  # an attempt left roles for one that never came
            standing.roles.shutdown()
