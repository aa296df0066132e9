"""Checkpoints of a run: the controller-side mechanics (layout, atomic commit, pruning, resume checks, RNG state).

Layout of one checkpoint, ``RUN/checkpoints/step_000010/``::

    trainer/          the trainer ranks' state (``PolicyWorker.save_state``: HF policy, optimizer, scheduler)
    critic/           the critic's state (optional)
    rollouts_ahead.pt asynchronous rollout (``rollout.max_staleness`` >= 1) only: the batches generated for the
                      next steps, ``{step: rollout}`` (torch); their weights are gone, so a resumed run reads them
    controller.json   step, policy version, sampler position, controller RNG states, the step's metrics
    recipe.yaml       the resolved recipe the checkpoint was trained with
    fingerprint.json  hashes of the training data (prompt texts, golds, rows, in order; and their count) and of
                      the recipe minus the keys that may change on resume (:data:`MAY_CHANGE_ON_RESUME`)
    COMPLETE          written last; a folder without it is not a checkpoint

Writing: :func:`begin` makes ``step_000010.tmp-<pid>-<token>``; the roles write their parts into it;
:func:`save_controller` writes the controller's three files; :func:`commit` fsyncs every file, writes
``COMPLETE`` and renames the folder to its final name in one ``rename``. A crash at any point leaves either a
``*.tmp-*`` folder (ignored by :func:`latest_complete`, deleted by :func:`prune`) or a whole checkpoint.

Best checkpoint: derived, not stored apart. Each checkpoint's ``controller.json`` holds the metrics logged at
its step; :func:`best_checkpoint` reads them. A checkpoint whose step did not log the metric (e.g. ``val/pass@1``
on a step without validation) is no candidate: checkpoint at validation steps. There is no ``best.json`` to
fall out of step with the folders after a crash or a manual deletion.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import os
import re
import secrets
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlvr.config import Recipe, RecipeError, dump_yaml, read_recipe, to_dict
from rlvr.seeding import rng_state

log = logging.getLogger(__name__)

FORMAT = 1
"""Version of the controller.json / fingerprint.json layout."""
CHECKPOINTS = "checkpoints"
TRAINER = "trainer"
CRITIC = "critic"
CONTROLLER = "controller.json"
AHEAD = "rollouts_ahead.pt"
RECIPE = "recipe.yaml"
FINGERPRINT = "fingerprint.json"
COMPLETE = "COMPLETE"
REQUIRED = (CONTROLLER, RECIPE, FINGERPRINT, TRAINER)
"""Entries :func:`commit` requires in a checkpoint before it may be marked complete."""

OPTIMIZER_KEYS = ("trainer.lr", "trainer.betas", "trainer.weight_decay", "trainer.grad_clip", "critic.lr",
                  "critic.grad_clip")  # fmt: skip
"""Optimizer settings a resumed run may change (``rlvr train R.yaml --resume auto trainer.lr=2e-5``), as verl and
OpenRLHF allow: the checkpoint's optimizer state (Adam's moments and step count) is loaded, then these values from
the new recipe replace the ones it held (:func:`rlvr.train.policy.apply_optimizer_settings`), and each change is
logged old -> new (:func:`optimizer_changes`)."""

MAY_CHANGE_ON_RESUME = (
    *OPTIMIZER_KEYS,
    "run.name", "run.output_dir", "run.steps", "run.resume", "run.executor", "run.ray_address", "run.num_cpus",
    "run.save_final",
    "rollout.num_engines", "rollout.kv_cache_gib", "rollout.gpu_memory_utilization", "rollout.enforce_eager",
    "rollout.num_gpus", "rollout.threads", "rollout.cpus",
    "reward.num_workers", "reward.warn_error_frac", "environment.warn_failure_frac",
    "trainer.threads", "trainer.cpus", "trainer.num_gpus", "trainer.micro_batch_size", "trainer.gradient_checkpointing",
    "critic.threads", "critic.num_gpus", "critic.micro_batch_size",
    "sync.", "metrics.", "checkpoint.",
    "validation.every_steps", "validation.at_start",
)  # fmt: skip
"""Recipe keys (a trailing ``.``: a whole section) that a resumed run may change: the optimizer settings
(:data:`OPTIMIZER_KEYS`: from the resumed step on, the run then differs from an uninterrupted one), how long to
run, where the run lives, processes, threads, devices and memory knobs (micro-batch size: the loss normalisers are
whole-batch counts, so the split does not change the update), logging, checkpointing, and how often to validate.
Every other
key changes the math, the data or the validation numbers the best checkpoint is chosen by, and must match.
``trainer.num_workers`` must match too: the optimizer state is partitioned over that many ranks."""

_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_DIR = re.compile(r"^step_(\d+)\.tmp-[0-9]+-[0-9a-f]+$")
_OLD_DIR = re.compile(r"^step_(\d+)\.old-[0-9]+-[0-9a-f]+$")
_IN_PROGRESS: set[Path] = set()  # tmp folders this process has begun and not committed (prune spares them)


def step_dir_name(step: int) -> str:
    """``step_000010`` for step 10 (6 digits, more when needed)."""
    return f"step_{step:06d}"


def checkpoint_step(ckpt_dir: str | Path) -> int:
    """The step in a checkpoint folder's name (``step_000010`` -> 10).

    Errors: ``ValueError`` when the name is not ``step_<digits>``.
    """
    m = _STEP_DIR.match(Path(ckpt_dir).name)
    if not m:
        raise ValueError(f"{ckpt_dir}: a checkpoint folder is named step_<digits> (e.g. step_000010)")
    return int(m.group(1))


def is_complete(ckpt_dir: str | Path) -> bool:
    """True when ``ckpt_dir`` is a committed checkpoint: named ``step_<digits>`` and holding ``COMPLETE``."""
    p = Path(ckpt_dir)
    return bool(_STEP_DIR.match(p.name)) and p.is_dir() and (p / COMPLETE).is_file()


# -- writing -----------------------------------------------------------------------------------------------------


def begin(run_dir: str | Path, step: int) -> Path:
    """Create and return the temporary folder of a new checkpoint: ``RUN/checkpoints/step_000010.tmp-<pid>-<hex>``.

    The roles write their parts into it (``trainer/``, ``critic/``), the controller its files (:func:`save_controller`);
    then :func:`commit`. Errors: ``ValueError`` for a negative or non-integer step.
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"checkpoint step must be an integer >= 0, got {step!r}")
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{step_dir_name(step)}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    _IN_PROGRESS.add(tmp.resolve())
    return tmp


def commit(tmp_dir: str | Path) -> Path:
    """Make a checkpoint begun by :func:`begin` whole: fsync every file, write ``COMPLETE``, rename the folder to
    ``step_000010`` (one atomic ``rename``), fsync the parent folder. Returns the final folder.

    If the final name exists (a step written again after resuming from an earlier checkpoint), the old folder is
    first renamed aside to ``step_000010.old-*`` and deleted after the new one is in place; a crash in between
    leaves the new checkpoint in place or, at worst, no folder of that step (never a mixed one).

    Errors: ``FileNotFoundError`` when ``tmp_dir`` does not exist; ``ValueError`` when it is not named like a
    :func:`begin` folder or lacks a required part (``controller.json``, ``recipe.yaml``, ``fingerprint.json``,
    ``trainer/``), in which case it is left as is (:func:`prune` deletes it).
    """
    tmp = Path(tmp_dir)
    if not tmp.is_dir():
        raise FileNotFoundError(f"checkpoint folder {tmp} does not exist (was it created by checkpoint.begin?)")
    key = tmp.resolve()
    m = _TMP_DIR.match(tmp.name)
    if not m:
        raise ValueError(f"{tmp}: not a temporary checkpoint folder (step_<digits>.tmp-<pid>-<hex>, from begin())")
    missing = [name for name in REQUIRED if not (tmp / name).exists()]
    if missing:
        raise ValueError(
            f"checkpoint {tmp} lacks {missing}: the controller (save_controller) and the trainer (save_state) must "
            "write their parts before commit; it is not marked complete"
        )
    for path in sorted(tmp.rglob("*")):
        if path.is_file() and not path.is_symlink():
            _fsync_file(path)
    for path in sorted((p for p in tmp.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        _fsync_dir(path)
    files = sum(1 for p in tmp.rglob("*") if p.is_file())
    with open(tmp / COMPLETE, "w", encoding="utf-8") as f:
        json.dump({"step": int(m.group(1)), "files": files}, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    final = tmp.with_name(step_dir_name(int(m.group(1))))
    old = None
    if final.exists():
        old = final.with_name(f"{final.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        final.rename(old)
    tmp.rename(final)
    _fsync_dir(final.parent)
    _IN_PROGRESS.discard(key)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def abandon(tmp_dir: str | Path) -> None:
    """Delete a temporary checkpoint folder that will not be committed (a role failed while saving)."""
    tmp = Path(tmp_dir)
    _IN_PROGRESS.discard(tmp.resolve())
    shutil.rmtree(tmp, ignore_errors=True)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # a platform without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- finding, pruning --------------------------------------------------------------------------------------------


def list_complete(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run folder, oldest step first (``[]`` when there are none)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if is_complete(p)), key=checkpoint_step)


def latest_complete(run_dir: str | Path) -> Path | None:
    """The complete checkpoint of the highest step in ``RUN/checkpoints``, or None. Temporary folders
    (``*.tmp-*``, ``*.old-*``) and folders without ``COMPLETE`` are never returned."""
    done = list_complete(run_dir)
    return done[-1] if done else None


def best_checkpoint(run_dir: str | Path, metric: str, mode: str = "max") -> Path | None:
    """The complete checkpoint whose ``controller.json`` metrics hold the best finite value of ``metric``
    (``mode`` ``max`` or ``min``); on a tie the earliest step. None when no checkpoint logged the metric.

    Errors: ``ValueError`` for another mode.
    """
    if mode not in ("max", "min"):
        raise ValueError(f"best_mode must be 'max' or 'min', got {mode!r}")
    best, best_value = None, None
    for ckpt in list_complete(run_dir):
        value = _read_json(ckpt / CONTROLLER).get("metrics", {}).get(metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        if best_value is None or (value > best_value if mode == "max" else value < best_value):
            best, best_value = ckpt, float(value)
    return best


def prune(run_dir: str | Path, keep_last: int, best_metric: str | None = None, best_mode: str = "max") -> list[Path]:
    """Delete old and broken checkpoint folders of a run; returns the deleted paths.

    Kept: the newest ``keep_last`` complete checkpoints (``checkpoint.keep_last``; 0: every one) and, when
    ``best_metric`` is set, the best one by :func:`best_checkpoint`. Deleted: every other complete checkpoint,
    every ``step_*`` folder without ``COMPLETE``, and every leftover ``*.tmp-*`` / ``*.old-*`` folder of a crashed
    write (also with ``keep_last`` 0), except the temporary folders this process has begun and not yet committed.

    Errors: ``ValueError`` for a bad ``best_mode`` or a negative ``keep_last``.
    """
    if keep_last < 0:
        raise ValueError(f"keep_last={keep_last}: keep the newest K >= 1 checkpoints, or 0 to keep every one")
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    done = list_complete(run_dir)
    keep = set(done if keep_last == 0 else done[-keep_last:])
    if best_metric:
        best = best_checkpoint(run_dir, best_metric, best_mode)
        if best is not None:
            keep.add(best)
    deleted = []
    for p in sorted(root.iterdir()):
        if not p.is_dir() or p in keep or p.resolve() in _IN_PROGRESS:
            continue
        if _STEP_DIR.match(p.name) or _TMP_DIR.match(p.name) or _OLD_DIR.match(p.name):
            shutil.rmtree(p, ignore_errors=True)
            deleted.append(p)
    return deleted


@dataclass(frozen=True, kw_only=True)
class RunPolicy:
    """A policy in Hugging Face format inside a run folder, and the recipe it was trained with."""

    run_dir: Path
    model_dir: Path
    recipe: Path
    """``RUN/recipe.yaml``, or for a checkpoint's policy the checkpoint's own ``recipe.yaml`` when it has one."""
    source: str
    """Which policy: ``final/`` or ``checkpoint step_000004``."""


def run_policy(model_dir: str | Path) -> RunPolicy | None:
    """The run behind a policy folder: ``RUN/final`` or ``RUN/checkpoints/step_N/trainer/hf`` whose run folder
    holds ``recipe.yaml`` (the resolved recipe written at run start); None for any other folder."""
    m = Path(model_dir)
    if m.name == "final" and (m.parent / RECIPE).is_file():
        return RunPolicy(run_dir=m.parent, model_dir=m, recipe=m.parent / RECIPE, source="final/")
    step = m.parent.parent
    if (m.name, m.parent.name, step.parent.name) == ("hf", TRAINER, CHECKPOINTS) and _STEP_DIR.match(step.name):
        run = step.parent.parent
        recipe = step / RECIPE if (step / RECIPE).is_file() else run / RECIPE
        if recipe.is_file():
            return RunPolicy(run_dir=run, model_dir=m, recipe=recipe, source=f"checkpoint {step.name}")
    return None


# -- resume ------------------------------------------------------------------------------------------------------


def resolve_resume(spec: str | Path | None, run_dir: str | Path) -> Path | None:
    """The checkpoint to resume from.

    ``spec`` None: None (a fresh start). ``"auto"``: the newest complete checkpoint of ``run_dir``
    (``output_dir/name``), None when it has none (a fresh start; incomplete folders are logged). A path: that
    folder, which must be a complete checkpoint.

    Errors: ``FileNotFoundError`` for a path that does not exist; ``ValueError`` for a path that is a file, a run
    folder or its ``checkpoints`` folder, an interrupted write (``*.tmp-*``, no ``COMPLETE``), or not a checkpoint
    folder at all; each message names the path and what to pass instead.
    """
    if spec is None:
        return None
    if str(spec) == "auto":
        found = latest_complete(run_dir)
        root = Path(run_dir) / CHECKPOINTS
        if found is None and root.is_dir() and any(root.iterdir()):
            log.warning("--resume auto: %s holds no complete checkpoint (only interrupted writes): fresh start", root)
        return found
    p = Path(spec).expanduser()
    if not p.exists():
        raise FileNotFoundError(
            f"--resume {spec}: no such folder; give a checkpoint folder such as RUN/checkpoints/step_000010, or "
            "--resume auto to take the newest checkpoint of output_dir/name"
        )
    if not p.is_dir():
        raise ValueError(f"--resume {spec}: is a file; give a checkpoint folder (RUN/checkpoints/step_000010)")
    if is_complete(p):
        return p
    if (p / CHECKPOINTS).is_dir() or p.name == CHECKPOINTS:
        newest = latest_complete(p.parent if p.name == CHECKPOINTS else p)
        hint = f"e.g. --resume {newest}" if newest else "it holds no complete checkpoint"
        raise ValueError(f"--resume {spec}: is a run's folder, not a checkpoint; pass one of its checkpoints ({hint})")
    if _TMP_DIR.match(p.name) or _OLD_DIR.match(p.name) or _STEP_DIR.match(p.name):
        newest = latest_complete(p.parent.parent)
        hint = f"resume from {newest} instead" if newest else "no complete checkpoint is left in that run"
        raise ValueError(
            f"--resume {spec}: not a complete checkpoint (no {COMPLETE} marker: its write was interrupted); {hint}"
        )
    raise ValueError(
        f"--resume {spec}: not a checkpoint folder (a checkpoint is RUN/checkpoints/step_<digits> holding "
        f"{COMPLETE}); pass one, or --resume auto"
    )


def check_compatible(ckpt_dir: str | Path, recipe: Recipe, data_fp: Mapping[str, Any]) -> None:
    """Check that ``recipe`` and the training data (``data_fp`` from :func:`data_fingerprint`) may resume the
    checkpoint, and that steps are left to run.

    Compared: every recipe key outside :data:`MAY_CHANGE_ON_RESUME` against the checkpoint's ``recipe.yaml``;
    the data fingerprint (count and sha256) against its ``fingerprint.json``; ``run.steps`` against the
    checkpoint's step (case C1: a resume that would train 0 steps is refused, never a silent success).

    Errors: :class:`~rlvr.config.RecipeError` (a ``ValueError``) listing each differing key as
    ``rollout.temperature: 1.0 -> 0.7``, a changed data set with its counts old -> new, or no steps left, with the ways
    to proceed; ``FileNotFoundError`` when the checkpoint lacks ``recipe.yaml`` or ``fingerprint.json``.
    """
    ckpt = Path(ckpt_dir)
    for name in (RECIPE, FINGERPRINT, CONTROLLER):
        if not (ckpt / name).is_file():
            raise FileNotFoundError(f"checkpoint {ckpt} lacks {name}: it was not written by this version of rlvr")
    old_recipe = yaml.safe_load((ckpt / RECIPE).read_text()) or {}
    defaults = to_dict(read_recipe(None, []))  # every setting at its default, resolved as a recipe's are
    problems = [f"{k}: {_fmt(a)} -> {_fmt(b)}" for k, a, b in recipe_diff(old_recipe, to_dict(recipe), defaults)]
    fixes = []
    if problems:
        fixes.append("revert these keys to the checkpoint's values")
    old_data = _read_json(ckpt / FINGERPRINT).get("data", {})
    if old_data.get("sha256") != data_fp.get("sha256") or old_data.get("count") != data_fp.get("count"):
        oc, nc = old_data.get("count"), data_fp.get("count")
        what = "same count, different content or order" if oc == nc else "different count"
        if oc == nc and any(p.startswith("model.path:") for p in problems):
            what = "the same count; the prompts' token ids differ because model.path changed the tokenizer"
        problems.append(f"training data changed: {oc} prompts -> {nc} prompts ({what})")
        fixes.append("restore the data (data.source file, data.limit, data.max_prompt_tokens, the tokenizer)")
    step = int(_read_json(ckpt / CONTROLLER)["step"])
    if recipe.run.steps <= step:
        problems.append(f"run.steps={recipe.run.steps} but the checkpoint is at step {step}: no steps left to run")
        fixes.append(f"raise run.steps above {step} to train further")
    if problems:
        fixes.append("or start a new run from scratch (drop --resume, or set another run.name)")
        raise RecipeError(
            f"cannot resume from {ckpt}:\n  - " + "\n  - ".join(problems) + "\nTo proceed: " + "; ".join(fixes) + "."
        )


DRAW_KEYS = ("rollout.num_engines",)
"""Keys a resumed run may change that change which samples are drawn from the same weights and seeds: each engine
seeds its sampler with the step's seed and samples its own share of the prompts, so another engine count splits
the batch otherwise and draws other rollouts than an uninterrupted run would (the resumed run is valid, not
identical). Logged as a warning at resume (:func:`changed_keys`)."""


def changed_keys(ckpt_dir: str | Path, recipe: Recipe, keys: Sequence[str]) -> list[tuple[str, Any, Any]]:
    """``(key, checkpoint's value, recipe's value)`` for each of ``keys`` that ``recipe`` changes against the
    checkpoint's ``recipe.yaml`` (values as plain data: betas as a list). Errors: ``FileNotFoundError`` when the
    checkpoint lacks ``recipe.yaml``."""
    old = _flatten(yaml.safe_load((Path(ckpt_dir) / RECIPE).read_text()) or {})
    new = _flatten(to_dict(recipe))
    return [(k, old.get(k, _ABSENT), new[k]) for k in keys if old.get(k, _ABSENT) != new[k]]


def optimizer_changes(ckpt_dir: str | Path, recipe: Recipe) -> list[tuple[str, Any, Any]]:
    """:func:`changed_keys` of :data:`OPTIMIZER_KEYS`. Errors: ``FileNotFoundError`` when the checkpoint lacks
    ``recipe.yaml``."""
    return changed_keys(ckpt_dir, recipe, OPTIMIZER_KEYS)


def recipe_diff(
    old: Mapping[str, Any], new: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old value, new value)`` for every leaf that differs between two recipe dicts (as from
    :func:`rlvr.config.to_dict`), keys in :data:`MAY_CHANGE_ON_RESUME` left out; a key missing on one side has
    the value ``<absent>``. Lists are compared whole (``reward.verifiers``).

    ``defaults``: a recipe dict of every default (resolved). A key absent from ``old`` whose new value is its
    default is no change: the checkpoint was written by an rlvr that did not have the setting yet, and ran as
    its default does (e.g. ``judge.*`` and ``algorithm.flawed_penalty``, added by issue 15); likewise a field
    absent from an entry of ``reward.verifiers`` (:func:`_verifiers_compared`)."""
    a, b = _flatten(old), _flatten(new)
    ca, cb = _flatten(_verifiers_compared(old)), _flatten(_verifiers_compared(new))  # the same keys as a, b
    d = _flatten(defaults) if defaults is not None else {}
    out = []
    for key in sorted(set(a) | set(b)):
        if _may_change(key):
            continue
        va, vb = a.get(key, _ABSENT), b.get(key, _ABSENT)
        if va is _ABSENT and key in d and vb == d[key]:
            continue
        if ca.get(key, _ABSENT) != cb.get(key, _ABSENT):
            out.append((key, va, vb))
    return out


def _verifiers_compared(tree: Mapping[str, Any]) -> Mapping[str, Any]:
    """``tree`` with each ``reward.verifiers`` entry as :func:`recipe_diff` compares it: fields it lacks (a
    checkpoint written before ``VerifierSpec`` had them) at their defaults, and ``key`` left out (it names the
    verifier's metrics only, so a resumed run may set one: issue 24)."""
    verifiers = (tree.get("reward") or {}).get("verifiers") if isinstance(tree.get("reward"), Mapping) else None
    if not isinstance(verifiers, list):
        return tree
    from rlvr.config import VerifierSpec

    default = {k: v for k, v in to_dict(VerifierSpec()).items() if k not in ("key", "name")}  # type: ignore[arg-type]
    entries = [{**default, **{k: v for k, v in e.items() if k != "key"}} if isinstance(e, Mapping) else e
               for e in verifiers]  # fmt: skip
    return {**tree, "reward": {**tree["reward"], "verifiers": entries}}


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


_ABSENT = _Absent()


def _may_change(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in MAY_CHANGE_ON_RESUME)


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _fmt(v: Any) -> str:
    if v is _ABSENT:
        return "<absent>"
    return json.dumps(v, sort_keys=True)


# -- fingerprints ----------------------------------------------------------------------------------------------


def data_fingerprint(prompts: Sequence[Any]) -> dict[str, Any]:
    """``{"count": N, "sha256": hex}`` over the prompts in order: each prompt's ``text`` (templated), ``gold`` and
    ``row`` (the fields verifiers see), as canonical JSON. Accepts :class:`~rlvr.types.Prompt` objects or
    mappings with those keys (``row`` optional)."""
    h = hashlib.sha256()
    for p in prompts:
        item = [_field(p, "text"), _field(p, "gold"), _field(p, "row") or {}]
        h.update(json.dumps(item, sort_keys=True, default=_json_default, ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return {"count": len(prompts), "sha256": h.hexdigest()}


def _field(p: Any, key: str) -> Any:
    return p.get(key) if isinstance(p, Mapping) else getattr(p, key, None)


def recipe_fingerprint(recipe: Recipe) -> str:
    """sha256 of the recipe's canonical JSON without the keys in :data:`MAY_CHANGE_ON_RESUME`."""
    kept = {k: v for k, v in _flatten(to_dict(recipe)).items() if not _may_change(k)}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode("utf-8")).hexdigest()


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):  # numpy arrays and scalars, tensors (rows read from parquet)
        return o.tolist()
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    if isinstance(o, bytes):
        return base64.b64encode(o).decode("ascii")
    return str(o)


# -- controller state --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ControllerState:
    """What ``controller.json`` holds: the last finished ``step``, the engines' ``policy_version``, the
    ``sampler`` position (``PromptSampler.state_dict``), the controller's ``rng`` states
    (:func:`rlvr.seeding.rng_state`) and the ``metrics`` logged at that step."""

    step: int
    policy_version: int
    sampler: dict[str, Any]
    rng: dict[str, Any]
    metrics: dict[str, float | None]


def save_controller(
    ckpt_dir: str | Path,
    *,
    step: int,
    policy_version: int,
    sampler_state: Mapping[str, Any],
    recipe: Recipe,
    data_fp: Mapping[str, Any],
    metrics: Mapping[str, float] | None = None,
) -> None:
    """Write ``controller.json`` (with this process's RNG states), ``recipe.yaml`` and ``fingerprint.json`` into a
    checkpoint folder from :func:`begin`. Non-finite metric values are stored as null.

    Errors: ``TypeError`` when the sampler state is not JSON-serialisable.
    """
    d = Path(ckpt_dir)
    state = {
        "format": FORMAT,
        "step": int(step),
        "policy_version": int(policy_version),
        "sampler": dict(sampler_state),
        "rng": rng_state(),
        "metrics": {k: _finite_or_none(v) for k, v in (metrics or {}).items()},
    }
    (d / CONTROLLER).write_text(json.dumps(state, indent=1))
    (d / RECIPE).write_text(dump_yaml(recipe))
    fp = {"format": FORMAT, "data": dict(data_fp), "recipe_sha256": recipe_fingerprint(recipe)}
    (d / FINGERPRINT).write_text(json.dumps(fp, indent=1))


def load_controller(ckpt_dir: str | Path) -> ControllerState:
    """Read ``controller.json`` of a checkpoint (RNG states are returned, not applied:
    :func:`rlvr.seeding.set_rng_state`).

    Errors: ``FileNotFoundError`` when it is missing; ``ValueError`` for a newer format or a missing key.
    """
    data = _read_json(Path(ckpt_dir) / CONTROLLER)
    if data.get("format", 0) > FORMAT:
        raise ValueError(f"{ckpt_dir}: controller.json format {data['format']} is newer than {FORMAT}; upgrade rlvr")
    try:
        return ControllerState(
            step=int(data["step"]),
            policy_version=int(data["policy_version"]),
            sampler=dict(data["sampler"]),
            rng=dict(data["rng"]),
            metrics=dict(data.get("metrics", {})),
        )
    except KeyError as e:
        raise ValueError(f"{ckpt_dir}/{CONTROLLER} lacks {e}; the checkpoint is damaged") from None


def _finite_or_none(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    return json.loads(path.read_text())
