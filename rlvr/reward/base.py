"""The Verifier seam: protocol, built-in registry, and resolution of a recipe's verifier spec.

A verifier scores one completion against its gold answer: ``verify(response, gold, **row) -> VerifyResult``.
It is given the completion text only (it knows nothing of prompts), ``row`` holds the data row's other
fields, and it never raises on model output: a bad answer is a score of 0 with a reason.

:func:`build_verifier` resolves ``VerifierSpec.name`` in this order:

1. a built-in short name (``math``, ``numeric``) from :data:`VERIFIERS`;
2. ``package.module:attr``;
3. ``path/to/file.py:attr`` (relative to the working directory);
4. an entry point named ``name`` in the group ``rlvr.verifiers`` (third-party packages).

``attr`` may be a class (instantiated with ``spec.args``), an object with a ``verify`` method, or a function
``verify(response, gold, **row)``; a function that returns a float, int or bool is wrapped so that it returns a
:class:`~rlvr.types.VerifyResult`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import inspect
import numbers
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

from rlvr.config import VerifierSpec
from rlvr.registry import Registry
from rlvr.types import VerifyResult
from rlvr.userfiles import is_file_target, load_file, missing_attribute

ENTRY_POINT_GROUP = "rlvr.verifiers"


@runtime_checkable
class Verifier(Protocol):
    """Scores one completion: ``verify(response, gold, **row) -> VerifyResult``; never raises on model output."""

    def verify(self, response: str, gold: str, **row: Any) -> VerifyResult: ...


class UnknownVerifierError(KeyError):
    """A verifier name that is neither built in, nor ``module:attr``, nor ``file.py:attr``, nor an entry point."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


class _BuiltinRegistry(Registry[Callable[..., Any]]):
    """A :class:`~rlvr.registry.Registry` that registers the built-ins of ``rlvr_verifiers`` on first use,
    so that ``import rlvr.reward`` does not import every verifier module."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self._loaded = False

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        import rlvr_verifiers

        for name, target in rlvr_verifiers.BUILTINS.items():
            if name not in self._items:
                module, attr = target.split(":")
                self._items[name] = getattr(importlib.import_module(module), attr)

    def get(self, name: str) -> Callable[..., Any]:
        self._load()
        return super().get(name)

    def __contains__(self, name: object) -> bool:
        self._load()
        return super().__contains__(name)

    def __iter__(self) -> Iterator[str]:
        self._load()
        return super().__iter__()

    def names(self) -> list[str]:
        self._load()
        return super().names()


VERIFIERS: Registry[Callable[..., Any]] = _BuiltinRegistry("verifier")
"""Built-in verifier factories by short name (``math``, ``numeric``), loaded from ``rlvr_verifiers`` on first
use. Names registered here in one process are not seen by scoring workers (separate processes): give your own
verifiers as ``module:attr``, ``file.py:attr`` or an entry point instead."""


SCORE_SLACK = 1e-6
"""A score within this of [0, 1] is rounding, not a bug (``0.1 + 0.2 + 0.7 == 1.0000000000000002``): it is clipped
into [0, 1]; one farther out is an :class:`InvalidScoreError`."""

INVALID_SCORE = "error: score "
"""Reason prefix of a sample whose verifier returned no valid score (:class:`InvalidScoreError`), e.g.
``error: score 7.5 outside [0, 1]``: the scoring pool scores that verifier 0 for the sample, as for a verifier
that raised (``error: <ExcType>: msg``); counted in ``reward/error_frac`` and ``reward/invalid_score_frac``."""


class InvalidScoreError(TypeError, ValueError):
    """A verifier returned something that is not a score in [0, 1]: not a number (None, a string), NaN, an
    infinity, or a number outside [0, 1] (by more than :data:`SCORE_SLACK`). Its message starts with ``score``
    (``score 7.5 outside [0, 1]``); the scoring pool's reason is ``error: `` + the message (:data:`INVALID_SCORE`).
    A ``TypeError`` and a ``ValueError``, as both were raised before."""


def coerce_result(value: Any) -> VerifyResult:
    """A verifier's return value as a :class:`VerifyResult` whose score lies in [0, 1].

    A VerifyResult passes through; a real number ``x`` (bool, int, float, a NumPy scalar) becomes
    ``VerifyResult(score=float(x))`` with reason None when ``x >= 1``, ``wrong`` when ``x <= 0``, else ``partial``.
    A score within :data:`SCORE_SLACK` of [0, 1] is clipped into it.
    Errors: :class:`InvalidScoreError` (a ``TypeError`` and ``ValueError``) for any other type, or a score that
    is NaN, infinite or outside [0, 1]: a verifier's score must lie in [0, 1] (scale it there, and weigh it with
    the recipe's ``weight``).
    """
    if isinstance(value, VerifyResult):
        score = value.score
    elif isinstance(value, numbers.Real):
        score = float(value)
        reason = None if score >= 1 else ("wrong" if score <= 0 else "partial")
        value = VerifyResult(score=score, parsed=None, reason=reason)
    else:
        raise InvalidScoreError(
            f"score {_shown(value)} ({type(value).__name__}) is not a number: return a VerifyResult, float or bool"
        )
    if not isinstance(score, numbers.Real):
        raise InvalidScoreError(f"score {_shown(score)} ({type(score).__name__}) is not a number")
    if not -SCORE_SLACK <= score <= 1 + SCORE_SLACK:  # NaN fails every comparison
        raise InvalidScoreError(f"score {float(score)!r} outside [0, 1]")
    if not 0 <= score <= 1 or type(score) is not float:
        value = dataclasses.replace(value, score=min(max(float(score), 0.0), 1.0))
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class FunctionVerifier:
    """Wraps a function ``fn(response, gold, **row)`` returning a VerifyResult, float or bool as a Verifier."""

    def __init__(self, fn: Callable[..., Any], name: str = "") -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", repr(fn))

    def verify(self, response: str, gold: str, **row: Any) -> VerifyResult:
        return coerce_result(self.fn(response, gold, **row))

    def __repr__(self) -> str:
        return f"FunctionVerifier({self.name})"


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def resolve_verifier(name: str) -> Any:
    """The object a verifier name points at (a class, a function or an object), without instantiating it.

    Errors: :class:`UnknownVerifierError` (a ``KeyError``) for an unknown short name, naming the nearest
    built-in and entry point; ``FileNotFoundError``, ``ImportError`` or ``AttributeError`` for a ``file.py:attr``
    or ``module:attr`` that does not resolve.
    """
    if name in VERIFIERS:
        return VERIFIERS.get(name)
    if ":" in name:
        target, _, attr = name.rpartition(":")
        module = load_file(target) if is_file_target(name) else importlib.import_module(target)
        obj: Any = module
        where = target  # the object searched: the module, then target:Class for a dotted Class.method
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise missing_attribute("verifier", name, where, obj, part)
            obj = getattr(obj, part)
            where = f"{where}{'.' if ':' in where else ':'}{part}"
        return obj
    eps = _entry_points()
    if name in eps:
        return eps[name].load()
    known = VERIFIERS.names() + sorted(eps)
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.3)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise UnknownVerifierError(
        f"unknown verifier {name!r}.{hint} Built-in: {', '.join(VERIFIERS.names())}; entry points "
        f"({ENTRY_POINT_GROUP}): {', '.join(sorted(eps)) or 'none'}; or give 'package.module:attr' or "
        "'path/to/file.py:attr'."
    )


def build_verifier(spec: VerifierSpec) -> Verifier:
    """Build the verifier a recipe names (see the module docstring for the resolution order).

    A class is instantiated with ``spec.args``; a function is wrapped in :class:`FunctionVerifier`; an object
    with a ``verify`` method is used as is. Errors: those of :func:`resolve_verifier`; ``TypeError`` when the
    target is not a verifier, or when ``spec.args`` is given for a function or an object (they take none).
    """
    obj = resolve_verifier(spec.name)
    if inspect.isclass(obj):
        verifier = obj(**spec.args)
        if not callable(getattr(verifier, "verify", None)):
            raise TypeError(f"verifier {spec.name!r}: {obj.__name__} has no verify(response, gold, **row) method")
        return verifier
    if spec.args:
        raise TypeError(
            f"verifier {spec.name!r} is not a class, so it takes no args (got {sorted(spec.args)}); "
            "make it a class whose constructor takes them"
        )
    if callable(getattr(obj, "verify", None)):
        return obj
    if callable(obj):
        return FunctionVerifier(obj, name=spec.name)
    raise TypeError(f"verifier {spec.name!r} is a {type(obj).__name__}: not a class, function or verifier")


def check_verifier_args(spec: VerifierSpec, where: str) -> None:
    """Check ``spec.args`` against what the verifier ``spec.name`` takes, without building it: a class's
    constructor signature (:func:`rlvr.registry.check_kwargs`); a function or an object with ``verify`` takes no
    args. ``where``: the recipe key of the args (``reward.verifiers[0].args``), named in the message.

    Errors: those of :func:`resolve_verifier`; :class:`~rlvr.config.RecipeError` for an unknown argument (with
    the nearest the constructor takes), a required one left out, or args given to a verifier that takes none.
    """
    from rlvr.config import RecipeError
    from rlvr.registry import check_kwargs

    obj = resolve_verifier(spec.name)
    if inspect.isclass(obj):
        check_kwargs(obj, dict(spec.args), where)
    elif spec.args:
        kind = "function" if inspect.isfunction(obj) else type(obj).__name__
        raise RecipeError(f"'{where}': verifier {spec.name!r} is a {kind}, not a class, so it takes no args (got "
                          f"{', '.join(sorted(spec.args))}); drop '{where}', or make it a class whose constructor "
                          "takes them")
