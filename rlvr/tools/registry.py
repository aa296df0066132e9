"""Tools by name, and their JSON schemas.

A tool is a typed Python function with a Google-style docstring; its JSON schema (what the chat template lists for
the model, and what each call's arguments are checked against) comes from ``transformers.utils.get_json_schema``:
the signature gives the parameters' types and which are required, the docstring's ``Args:`` their descriptions.

Names resolve as verifiers and environments do: a built-in short name (:data:`BUILTINS`), ``package.module:func``
or ``path/to/file.py:func``. The name the model calls is the function's own ``__name__`` (the schema's ``name``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

BUILTINS = {"calculator": "rlvr.tools.builtins:calculator", "python": "rlvr.tools.builtins:python"}
"""Built-in tools by short name."""


@dataclass(frozen=True)
class Tool:
    """A resolved tool: ``target`` (the recipe's name for it, resolvable in any process), ``name`` (what the model
    calls), ``schema`` (the OpenAI-style ``{"type": "function", "function": {...}}`` the template lists)."""

    target: str
    name: str
    schema: dict[str, Any]

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"].get("parameters") or {"type": "object", "properties": {}}


def resolve_function(target: str) -> Callable[..., Any]:
    """The function a tool name points at (see the module docstring).

    Errors: ``KeyError`` for an unknown short name (naming the nearest built-in), ``FileNotFoundError``/
    ``ImportError``/``AttributeError`` for a target that does not resolve, ``TypeError`` when it is not a function."""
    import difflib

    from rlvr.reward.base import _load_file, is_file_target

    if target in BUILTINS:
        target = BUILTINS[target]
    if ":" not in target:
        near = difflib.get_close_matches(target, sorted(BUILTINS), n=1, cutoff=0.3)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise KeyError(f"unknown tool {target!r}.{hint} Built-in: {', '.join(sorted(BUILTINS))}; or give "
                       "'package.module:func' or 'path/to/file.py:func'.")
    module_name, _, attr = target.rpartition(":")
    module = _load_file(module_name) if is_file_target(target) else importlib.import_module(module_name)
    if not hasattr(module, attr):
        raise AttributeError(f"tool {target!r}: {module_name} has no attribute {attr!r}")
    fn = getattr(module, attr)
    if not callable(fn) or isinstance(fn, type):
        raise TypeError(f"tool {target!r} is not a function (a tool is a typed function with a docstring)")
    return fn


def resolve_tool(target: str) -> Tool:
    """:class:`Tool` for a name. Errors: those of :func:`resolve_function`; ``ValueError`` when the function's
    schema cannot be built (a parameter without a type hint, or missing from the docstring's ``Args:``), with
    transformers' reason."""
    from transformers.utils import get_json_schema

    fn = resolve_function(target)
    try:
        schema = get_json_schema(fn)
    except Exception as e:  # noqa: BLE001 - transformers raises its own DocstringParsingException / TypeHintParsingException
        raise ValueError(f"tool {target!r}: no JSON schema from its signature and docstring ({e}); a tool needs a "
                         "type hint on every parameter and a Google-style docstring with an 'Args:' entry for each"
                         ) from None
    return Tool(target=target, name=schema["function"]["name"], schema=schema)


def resolve_tools(targets: tuple[str, ...] | list[str]) -> list[Tool]:
    """Each name resolved; ``ValueError`` when two resolve to the same called name."""
    tools = [resolve_tool(t) for t in targets]
    seen: dict[str, str] = {}
    for t in tools:
        if t.name in seen:
            raise ValueError(f"tools {seen[t.name]!r} and {t.target!r} are both called {t.name!r}: the model could "
                             "not tell them apart")
        seen[t.name] = t.target
    return tools


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
    "object": (dict,), "null": (type(None),), "any": (object,),
}  # fmt: skip


def _type_ok(value: Any, spec: dict[str, Any]) -> bool:
    types = spec.get("type", "any")
    types = types if isinstance(types, list) else [types]
    for t in types:
        py = _JSON_TYPES.get(t, (object,))
        if isinstance(value, bool) and t in ("integer", "number"):
            continue
        if isinstance(value, py):
            return True
    return False


def check_arguments(tool: Tool, args: Any) -> str | None:
    """None when ``args`` fit the tool's schema (an object; every required parameter given; no unknown name; each
    value of its JSON type, and in its ``enum`` when it has one); else what is wrong, in words a model can act on."""
    params = tool.parameters
    props: dict[str, Any] = params.get("properties", {})
    if not isinstance(args, dict):
        return f"the arguments of {tool.name} must be a JSON object, got {type(args).__name__}"
    unknown = [k for k in args if k not in props]
    if unknown:
        return f"{tool.name} has no parameter {unknown[0]!r} (its parameters: {', '.join(props) or 'none'})"
    missing = [k for k in params.get("required", []) if k not in args]
    if missing:
        return f"{tool.name} needs the argument {missing[0]!r}"
    for k, v in args.items():
        spec = props[k]
        if not _type_ok(v, spec):
            return f"the argument {k!r} of {tool.name} must be of type {spec.get('type')}, got {v!r}"[:300]
        if "enum" in spec and v not in spec["enum"]:
            return f"the argument {k!r} of {tool.name} must be one of {spec['enum']}, got {v!r}"[:300]
    return None
