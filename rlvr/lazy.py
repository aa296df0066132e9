"""A module imported on first use, so that loading a recipe (which imports the algorithm registries to resolve
each named entry's settings) does not import torch (~2.5 s here).

The pattern of Scientific Python's SPEC 1 (lazy loading) and transformers' ``_LazyModule``, for one module:
``torch = lazy_module("torch")`` in a module whose functions call ``torch.*``; the first attribute read imports the
real module and copies its namespace into the proxy, so later reads are plain attribute lookups. Annotations that
name ``torch.Tensor`` stay strings (``from __future__ import annotations``; ``Tensor`` under ``TYPE_CHECKING``).
"""

from __future__ import annotations

import functools
import importlib
import types
from typing import Any


class _LazyModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:  # called only for names not yet in the proxy's namespace
        real = importlib.import_module(self.__name__)
        self.__dict__.update({k: v for k, v in vars(real).items() if k not in ("__name__", "__spec__")})
        return getattr(real, attr)


@functools.cache  # one proxy per module: the algorithm modules share torch's, filled once
def lazy_module(name: str) -> Any:
    """A stand-in for ``import name`` that imports ``name`` on the first attribute read (errors from the import,
    e.g. ``ModuleNotFoundError``, surface there)."""
    return _LazyModule(name)
