"""Metric sinks: where the step loop's namespaced metric dicts (``reward/mean``, ``passk/8``,
``timing/rollout_s``, ``sync/gbps``) and sample tables are written.

Every run writes ``RUN/metrics.jsonl`` (:class:`JsonlSink`); ``metrics.backends`` adds TensorBoard
(``RUN/tensorboard``), Weights & Biases (``RUN/wandb``, offline by default) and MLflow (a file store
``RUN/mlruns`` by default). :func:`make_sinks` builds them all behind one :class:`MultiSink`, which keeps a run
alive when an optional backend fails: one warning, then that backend is switched off.

Each sink has ``log(step, metrics)``, ``log_table(step, rows)`` and ``close()``. A metric value is anything
:func:`to_float` accepts; NaN/inf are written as ``null`` to JSONL and skipped by the other backends. A table
row is a dict of cells: str / number / bool / None, and, in a multi-turn trajectory's row, lists and dicts of those
(its messages, per-turn rewards and info: :func:`rlvr.metrics.samples.sample_rows`), written as JSON data to
``samples.jsonl`` and as JSON text to the other backends' tables (:func:`json_cell`, :func:`flat_cell`).

Optional packages (``pip install 'rlvr[logging]'``): ``tensorboard``, ``wandb``, ``mlflow-skinny`` (or
``mlflow``); each is imported by the sink that needs it.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import urlparse

log = logging.getLogger(__name__)


def to_float(value: Any) -> float | None:
    """A metric value as a Python float; NaN and +-inf become None (JSON ``null``).

    Accepts Python/NumPy numbers, bools, and one-element tensors/arrays (anything with ``.item()``).
    Errors: ``TypeError`` for anything else (strings, lists, tensors of more than one element).
    """
    if hasattr(value, "item") and not isinstance(value, numbers.Number):
        size = value.numel() if hasattr(value, "numel") else getattr(value, "size", 1)
        if size != 1:
            raise TypeError(f"a metric must be one number, got a tensor/array of {size} elements")
        value = value.item()
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else None
    raise TypeError(f"a metric must be a number, got {type(value).__name__}: {value!r}")


class JsonlSink:
    """Appends one JSON object per step to ``path``: ``{"step": s, "reward/mean": 0.5, ...}``.

    Each line is flushed as soon as it is written, so a crashed run keeps every logged step. The file is
    opened for appending (a resumed run continues it); its folder is created if missing. Values are written
    as floats, NaN/inf as ``null``. Usable as a context manager.

    Sample tables (:meth:`log_table`) go to ``samples_path`` (default: ``samples.jsonl`` beside ``path``), one
    line per row: ``{"step": s, **row}``; that file is opened (for appending) on the first table.
    """

    def __init__(self, path: str | Path, *, samples_path: str | Path | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self.samples_path = Path(samples_path) if samples_path is not None else self.path.with_name("samples.jsonl")
        self._samples = None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Write ``{"step": step, **metrics}`` as one line.

        Errors: ``ValueError`` after :meth:`close` or when ``metrics`` has a ``step`` key; ``TypeError`` for a
        non-string key or a value :func:`to_float` refuses.
        """
        if self._file.closed:
            raise ValueError(f"JsonlSink({self.path}) is closed")
        if "step" in metrics:
            raise ValueError("'step' is reserved for the step number; rename the metric")
        row: dict[str, Any] = {"step": int(step)}
        for key, value in metrics.items():
            if not isinstance(key, str):
                raise TypeError(f"metric names must be strings, got {key!r}")
            row[key] = to_float(value)
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()

    def log_table(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append ``{"step": step, **row}`` for each row to :attr:`samples_path` (flushed at once).

        Numbers go through :func:`to_float` (NaN/inf -> ``null``); bools, strings and None are kept as they are.
        Errors: ``ValueError`` after :meth:`close` or when a row has a ``step`` key; ``TypeError`` for a value
        that is none of those.
        """
        if self._file.closed:
            raise ValueError(f"JsonlSink({self.path}) is closed")
        lines = []
        for row in rows:
            if "step" in row:
                raise ValueError("'step' is reserved for the step number; rename the column")
            lines.append(json.dumps({"step": int(step), **{str(k): json_cell(v) for k, v in row.items()}},
                                    allow_nan=False))
        if self._samples is None:
            self.samples_path.parent.mkdir(parents=True, exist_ok=True)
            self._samples = self.samples_path.open("a", encoding="utf-8")
        self._samples.write("".join(line + "\n" for line in lines))
        self._samples.flush()

    def close(self) -> None:
        """Close the files (idempotent)."""
        self._file.close()
        if self._samples is not None:
            self._samples.close()

    def __enter__(self) -> "JsonlSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def json_cell(value: Any) -> Any:
    """A table cell as JSON data: str/bool/None/int unchanged, other numbers as floats (NaN/inf -> None), lists and
    tuples as lists and dicts as dicts (string keys) of such cells, any other value inside them as its ``str``.
    Errors: ``TypeError`` for a top-level value that is none of those (a row's own columns are rlvr's)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, (list, tuple)):
        return [_inner(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _inner(v) for k, v in value.items()}
    return to_float(value)


def _inner(value: Any) -> Any:
    """A value inside a list or dict cell (an environment's info may hold anything): as :func:`json_cell`, its
    ``str`` when that refuses it."""
    try:
        return json_cell(value)
    except TypeError:
        return str(value)


def flat_cell(value: Any) -> Any:
    """A cell for a backend whose tables hold scalars (W&B, MLflow): :func:`json_cell`, a list or dict as its JSON
    text."""
    out = json_cell(value)
    return json.dumps(out, ensure_ascii=False) if isinstance(out, (list, dict)) else out


def _finite(metrics: Mapping[str, Any]) -> dict[str, float]:
    """``metrics`` as floats, without the NaN/inf values (which the optional backends skip)."""
    out = {}
    for key, value in metrics.items():
        f = to_float(value)
        if f is not None:
            out[str(key)] = f
    return out


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Column names of ``rows`` in first-seen order (a row may lack some; its cell is then None)."""
    cols: dict[str, None] = {}
    for row in rows:
        cols.update(dict.fromkeys(map(str, row)))
    return list(cols)


def markdown_table(rows: Sequence[Mapping[str, Any]], max_chars: int = 2000) -> str:
    """``rows`` as a GitHub-flavoured markdown table (one column per key, in first-seen order).

    Cells: floats with 4 significant digits, None as empty; other values as text, cut to ``max_chars``
    characters (then `` ...``), ``|`` escaped, newlines as ``<br>`` (for TensorBoard's text tab).
    """
    cols = _columns(rows)

    def fmt(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return format(v, ".4g")
        text = json.dumps(json_cell(v), ensure_ascii=False) if isinstance(v, (list, tuple, dict)) else str(v)
        if len(text) > max_chars:
            text = text[:max_chars] + " ..."
        return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(row.get(c)) for c in cols) + " |" for row in rows]
    return "\n".join(lines)


def _missing(package: str, backend: str) -> ImportError:
    return ImportError(
        f"the {backend} metrics backend needs the '{package}' package: pip install 'rlvr[logging]' "
        f"(or pip install {package}), or remove '{backend}' from metrics.backends"
    )


class TensorBoardSink:
    """Writes scalars (one tag per metric name, x = step) and sample tables (text tab, tag ``samples``, as a
    markdown table) to TensorBoard event files in ``log_dir`` (``tensorboard --logdir RUN/tensorboard``).

    Uses ``torch.utils.tensorboard.SummaryWriter``; events are flushed after every call, so a crashed run keeps
    what it logged. NaN/inf values are skipped. Errors: ``ImportError`` naming the pip package when
    ``tensorboard`` is not installed.
    """

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch raises ImportError when the tensorboard package is absent
            raise _missing("tensorboard", "tensorboard") from e
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """One scalar event per finite metric at ``step``."""
        for key, value in _finite(metrics).items():
            self._writer.add_scalar(key, value, global_step=int(step))
        self._writer.flush()

    def log_table(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """The rows as a markdown table under the text tag ``samples`` at ``step`` (see :func:`markdown_table`)."""
        self._writer.add_text("samples", markdown_table(rows), global_step=int(step))
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file (idempotent)."""
        self._writer.close()


class WandbSink:
    """Logs to a Weights & Biases run whose files live under ``run_dir/wandb``.

    ``mode="offline"`` needs no network and no account: W&B writes ``run_dir/wandb/offline-run-<time>-<id>/``
    (``run-<id>.wandb`` holds the history), which ``wandb sync <that folder>`` uploads later. ``"online"`` needs
    ``wandb login`` (or ``WANDB_API_KEY``). ``config`` (nested dict: the resolved recipe) is the run's config.
    Console capture is off (``RUN/train.log`` has the log). Metrics: ``run.log(finite metrics, step=step)``;
    tables: a ``wandb.Table`` under the key ``samples``. W&B needs non-decreasing steps: log a step's table
    before the next step's metrics.

    Errors: ``ImportError`` naming the pip package when ``wandb`` is not installed; whatever ``wandb.init``
    raises (e.g. online mode without credentials).
    """

    def __init__(
        self,
        run_dir: str | Path,
        project: str,
        name: str,
        mode: str = "offline",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            import wandb
        except ImportError as e:
            raise _missing("wandb", "wandb") from e
        self._wandb = wandb
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=name,
            dir=str(self.run_dir),
            mode=mode,
            config=dict(config or {}),
            settings=wandb.Settings(console="off"),
        )
        self._closed = False

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """``run.log`` of the finite metrics at ``step``."""
        self.run.log(_finite(metrics), step=int(step))

    def log_table(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """The rows as a ``wandb.Table`` (columns in first-seen order) under ``samples`` at ``step``."""
        cols = _columns(rows)
        data = [[flat_cell(row.get(c)) for c in cols] for row in rows]
        self.run.log({"samples": self._wandb.Table(columns=cols, data=data)}, step=int(step))

    def close(self) -> None:
        """Finish the run, then ``wandb.teardown()`` (idempotent); the run's files are complete on disk afterwards.

        ``run.finish()`` alone returned before the history reached ``run-<id>.wandb`` in about half of the tries
        (wandb 0.31, offline); ``teardown`` waits for W&B's service process to write everything and stop. It ends
        W&B's session in this process, so a later ``wandb.init`` starts a new one.
        """
        if not self._closed:
            self._closed = True
            try:
                self.run.finish()
            finally:
                self._wandb.teardown()


_MLFLOW_BAD = re.compile(r"[^/\w.\- :]")


def mlflow_name(name: str) -> str:
    """A metric/param name MLflow accepts: ``@`` -> ``_at_``, any other character outside letters, digits,
    ``_ - . / : space`` -> ``_`` (``val/pass@8`` -> ``val/pass_at_8``, ``reward/score/math#2`` ->
    ``reward/score/math_2``); cut to 250 characters (MLflow's limit)."""
    return _MLFLOW_BAD.sub("_", name.replace("@", "_at_"))[:250]


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mapping -> ``{"a.b": "value"}`` (lists and other leaves as ``str``)."""
    out: dict[str, str] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = str(value)
    return out


def _is_file_store(uri: str) -> bool:
    scheme = urlparse(uri).scheme
    return scheme in ("", "file") or len(scheme) == 1  # a bare path, file:..., or a Windows drive letter


class MLflowSink:
    """Logs to an MLflow run: experiment ``experiment`` (created if missing), run ``run_name``.

    ``uri``: a tracking URI; a folder path or ``file:`` URI is a local file store (no server). MLflow >= 3.7
    refuses file stores unless ``MLFLOW_ALLOW_FILE_STORE=true``, so this sink sets that variable (if unset)
    for a file store; ``mlflow-skinny`` is enough for it (``sqlite:`` stores need the full ``mlflow``).
    ``params``: nested mapping (the resolved recipe), logged flattened as ``a.b`` params (values cut to 6000
    characters, MLflow's limit). Metric and param names pass through :func:`mlflow_name` (``@``, ``#`` are not
    allowed). Tables go to the run's artifacts as ``samples/step_<step:06d>.json`` (``MlflowClient.log_table``).

    Errors: ``ImportError`` naming the pip package when neither ``mlflow`` nor ``mlflow-skinny`` is installed;
    ``mlflow.exceptions.MlflowException`` from the store (e.g. an unreachable server).
    """

    def __init__(self, uri: str | Path, experiment: str, run_name: str, params: Mapping[str, Any] | None = None) -> None:
        uri = str(uri)
        if _is_file_store(uri):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            if urlparse(uri).scheme != "file":
                uri = Path(uri).resolve().as_uri()
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise _missing("mlflow-skinny", "mlflow") from e
        self._metric, self._param = Metric, Param
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        items = [self._param(mlflow_name(k), v[:6000]) for k, v in _flatten(params or {}).items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i : i + 100])
        self._closed = False

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """One metric point per finite metric at ``step`` (timestamp: now, in ms)."""
        import time

        now = int(time.time() * 1000)
        items = [self._metric(mlflow_name(k), v, now, int(step)) for k, v in _finite(metrics).items()]
        for i in range(0, len(items), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=items[i : i + 1000])

    def log_table(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """The rows as the artifact ``samples/step_<step:06d>.json`` (columns in first-seen order)."""
        cols = _columns(rows)
        data = {c: [flat_cell(row.get(c)) for row in rows] for c in cols}
        self.client.log_table(self.run_id, data=data, artifact_file=f"samples/step_{int(step):06d}.json")

    def close(self) -> None:
        """Mark the run FINISHED (idempotent)."""
        if not self._closed:
            self._closed = True
            self.client.set_terminated(self.run_id, "FINISHED")


class MultiSink:
    """The run's JSONL sink plus optional backends, used as one sink.

    Every call goes to ``jsonl`` first; its errors propagate (bad metric names or values are bugs). Then to each
    backend still enabled, in order: the first exception a backend raises (in ``log``, ``log_table`` or
    ``close``) is logged as one warning naming the backend, and that backend gets no further calls (its
    ``close`` is still tried once, quietly). So a failing backend never stops the run, and the JSONL file still
    gets every row. Usable as a context manager.
    """

    def __init__(self, jsonl: JsonlSink, backends: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        self.jsonl = jsonl
        self.backends: dict[str, Any] = dict(backends)
        self.disabled: dict[str, str] = {}
        """Backend name -> the error that switched it off."""

    @property
    def active(self) -> list[str]:
        """Names of the backends still enabled."""
        return [n for n in self.backends if n not in self.disabled]

    def _each(self, method: str, *args: Any) -> None:
        for name in self.active:
            fn = getattr(self.backends[name], method, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - an optional backend must not end the run
                self.disabled[name] = f"{type(e).__name__}: {e}"
                log.warning("metrics backend %r failed in %s (%s); it is off for the rest of the run "
                            "(metrics.jsonl is unaffected)", name, method, self.disabled[name])
                if method != "close":
                    try:
                        self.backends[name].close()
                    except Exception as e2:  # noqa: BLE001 - already reported; closing is best effort
                        log.debug("closing metrics backend %r after its failure: %s", name, e2)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Log one step's metrics to every sink (see :meth:`JsonlSink.log` for the errors raised)."""
        self.jsonl.log(step, metrics)
        self._each("log", step, metrics)

    def log_table(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Log a sample table to every sink (see :meth:`JsonlSink.log_table` for the errors raised)."""
        rows = [dict(r) for r in rows]
        self.jsonl.log_table(step, rows)
        self._each("log_table", step, rows)

    def close(self) -> None:
        """Close every backend, then the JSONL files (idempotent for the JSONL sink)."""
        try:
            self._each("close")
        finally:
            self.jsonl.close()

    def __enter__(self) -> "MultiSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_sinks(recipe: Any, run_dir: str | Path) -> MultiSink:
    """The run's sinks: ``RUN/metrics.jsonl`` (+ ``RUN/samples.jsonl``) always, plus ``recipe.metrics.backends``:

    - ``tensorboard``: :class:`TensorBoardSink` on ``RUN/tensorboard``;
    - ``wandb``: :class:`WandbSink` in ``RUN/wandb``, project ``metrics.wandb_project``, mode
      ``metrics.wandb_mode``, run name = the run folder's name, config = the resolved recipe (+ ``derived``);
    - ``mlflow``: :class:`MLflowSink` on ``metrics.mlflow_uri`` (None: the file store ``RUN/mlruns``),
      experiment = ``run.name``, run name = the run folder's name, params = the resolved recipe.

    Errors (raised here, before any training; sinks already opened are closed): ``ImportError`` naming the pip
    package for a backend whose package is missing; whatever a backend raises while starting (e.g. W&B online
    without credentials); ``ValueError`` for an unknown backend name.
    """
    from rlvr.config import to_dict

    run_dir = Path(run_dir)
    m = recipe.metrics
    backends: dict[str, Any] = {}
    jsonl = JsonlSink(run_dir / "metrics.jsonl")
    try:
        for name in m.backends:
            if name == "tensorboard":
                backends[name] = TensorBoardSink(run_dir / "tensorboard")
            elif name == "wandb":
                config = {**to_dict(recipe), "derived": recipe.derived()}
                backends[name] = WandbSink(run_dir, m.wandb_project, run_dir.name, m.wandb_mode, config)
            elif name == "mlflow":
                uri = m.mlflow_uri if m.mlflow_uri is not None else str(run_dir / "mlruns")
                backends[name] = MLflowSink(uri, recipe.run.name, run_dir.name, to_dict(recipe))
            else:
                raise ValueError(f"unknown metrics backend {name!r}; choose from tensorboard, wandb, mlflow")
    except BaseException:
        MultiSink(jsonl, backends).close()
        raise
    return MultiSink(jsonl, backends)
