"""Metric sinks: where the step loop's namespaced metric dicts (``reward/mean``, ``passk/8``,
``timing/rollout_s``, ``sync/gbps``) are written.
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import Any, Mapping


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
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

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

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._file.close()

    def __enter__(self) -> "JsonlSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
