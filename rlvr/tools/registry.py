"""Tools by name, and their JSON schemas.

A tool is a typed Python function with a Google-style docstring; its JSON schema (what the chat template lists for
the model, and what each call's arguments are checked against) comes from ``transformers.utils.get_json_schema``:
the signature gives the parameters' types and which are required, the docstring's ``Args:`` their descriptions.

A **stateful tool** (an interpreter session, a file system) is a class instead: each of its public methods (a name
without a leading ``_``, other than ``close``), typed and documented the same way, is a tool the model calls by the
method's name (the schema of the bound method: ``self`` is not a parameter). ``__init__(self)`` takes no arguments
and creates one trajectory's state; an optional ``close(self)`` releases it. rlvr creates the instance at the
trajectory's first call of one of its methods and keeps it, pickled, with the trajectory between calls (so its
attributes must pickle); it calls ``close()`` once when the trajectory ends, however it ends
(:mod:`rlvr.tools.runner`).

Names resolve as verifiers and environments do: a built-in short name (:data:`BUILTINS`), ``package.module:name``
or ``path/to/file.py:name``. The name the model calls is the function's (or method's) own ``__name__`` (the
schema's ``name``).

Every tool runs isolated (:mod:`rlvr.tools.isolation`): its call's own folder, no network, a scrubbed environment,
its whole process tree killed when the call ends. A tool that needs more declares it with :func:`access`
(``@access(network=True)``, ``write=[folder]``, ``read=[folder]``, ``env=[name]``); the recipe's tool list is
logged at start with what each may reach.
"""

from __future__ import annotations

import importlib
import inspect
import types
from dataclasses import dataclass
from typing import Any

ACCESS_ATTRIBUTE = "__rlvr_access__"
"""The attribute :func:`access` sets on a tool function or class."""


@dataclass(frozen=True)
class Access:
    """What a tool may reach beyond the strict default of :mod:`rlvr.tools.isolation` (its call's own folder, no
    network, no environment variable but ``PATH``/``LANG``/``HOME``/``TMPDIR``), declared on the tool with
    :func:`access`; every field empty is the default.

    ``network``: the host's network (no network namespace, no socket audit hook); ``write``: folders (absolute
    paths) the tool may write, bound read-write into its view (as root the calls run as ``nobody``: the folder must
    be writable by ``nobody``); ``read``: folders (absolute) the tool must read that the isolation hides (under
    ``/home``, ``/root``, ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``), bound read-only; ``env``: names of the
    trainer's environment variables passed to the tool (read when the pool starts)."""

    network: bool = False
    write: tuple[str, ...] = ()
    read: tuple[str, ...] = ()
    env: tuple[str, ...] = ()

    @property
    def strict(self) -> bool:
        return self == Access()

    def describe(self) -> str:
        """``network; writes /a, /b; reads /c; env X, Y`` (``strict`` when nothing is opened)."""
        parts = (["network"] if self.network else []) + [f"{what} {', '.join(v)}" for what, v in
                                                         (("writes", self.write), ("reads", self.read),
                                                          ("env", self.env)) if v]  # fmt: skip
        return "; ".join(parts) or "strict"


def access(*, network: bool = False, write: tuple[str, ...] | list[str] = (), read: tuple[str, ...] | list[str] = (),
           env: tuple[str, ...] | list[str] = ()) -> Any:
    """A decorator declaring what a tool (a function, or a stateful tool class: all its methods) may reach beyond the
    strict default (:class:`Access`)::

        from rlvr.tools.registry import access

        @access(network=True, env=["SEARCH_API_KEY"])
        def search(query: str) -> str: ...

    Errors (when the tool is resolved, naming it): ``ValueError`` for a folder that is not an absolute path or does
    not exist, or an environment variable name that is not one."""
    spec = Access(bool(network), tuple(str(p) for p in write), tuple(str(p) for p in read), tuple(env))

    def mark(obj: Any) -> Any:
        setattr(obj, ACCESS_ATTRIBUTE, spec)
        return obj

    return mark


def tool_access(obj: Any, target: str) -> Access:
    """The :class:`Access` declared on ``obj`` (the default when none), checked.
    Errors: ``ValueError`` naming the tool and the fix."""
    import os
    import re

    spec = getattr(obj, ACCESS_ATTRIBUTE, None) or Access()
    if not isinstance(spec, Access):
        raise ValueError(f"tool {target!r}: {ACCESS_ATTRIBUTE} must be set with rlvr.tools.registry.access(...)")
    for kind, paths in (("write", spec.write), ("read", spec.read)):
        for p in paths:
            if not os.path.isabs(p) or not os.path.isdir(p):
                raise ValueError(f"tool {target!r}: access({kind}=...) names {p!r}, which is not an absolute path to "
                                 "an existing folder; give the folder's absolute path (create it first)")
    for name in spec.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"tool {target!r}: access(env=...) names {name!r}, which is not an environment "
                             "variable name")
    return spec


BUILTINS = {"calculator": "rlvr.tools.builtins:calculator", "python": "rlvr.tools.builtins:python",
            "python_session": "rlvr.tools.builtins:PythonSession", "files": "rlvr.tools.builtins:Files"}
"""Built-in tools by short name."""


@dataclass(frozen=True)
class Tool:
    """A resolved tool: ``target`` (the recipe's name for it, resolvable in any process), ``name`` (what the model
    calls), ``schema`` (the OpenAI-style ``{"type": "function", "function": {...}}`` the template lists).

    For a method of a stateful tool class: ``method`` (its name; None for a function), ``owner`` (the class's
    ``__name__``, for counters and messages) and ``closes`` (the class has ``close()``)."""

    target: str
    name: str
    schema: dict[str, Any]
    method: str | None = None
    owner: str = ""
    closes: bool = False
    access: Access = Access()

    @property
    def stateful(self) -> bool:
        return self.method is not None

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"].get("parameters") or {"type": "object", "properties": {}}


def resolve_target(target: str) -> Any:
    """The function or stateful tool class a tool name points at (see the module docstring).

    Errors: ``KeyError`` for an unknown short name (naming the nearest built-in), ``FileNotFoundError``/
    ``ImportError``/``AttributeError`` for a target that does not resolve, ``TypeError`` when it is neither a
    function nor a class."""
    import difflib

    from rlvr.userfiles import is_file_target, load_file, missing_attribute

    if target in BUILTINS:
        target = BUILTINS[target]
    if ":" not in target:
        near = difflib.get_close_matches(target, sorted(BUILTINS), n=1, cutoff=0.3)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise KeyError(f"unknown tool {target!r}.{hint} Built-in: {', '.join(sorted(BUILTINS))}; or give "
                       "'package.module:name' or 'path/to/file.py:name'.")
    module_name, _, attr = target.rpartition(":")
    module = load_file(module_name, "tool") if is_file_target(target) else importlib.import_module(module_name)
    if not hasattr(module, attr):
        raise missing_attribute("tool", target, module_name, module, attr)
    obj = getattr(module, attr)
    if not inspect.isclass(obj) and not callable(obj):
        raise TypeError(f"tool {target!r} is not a function or a class (a tool is a typed function with a docstring, "
                        "or a class whose public methods are)")
    return obj


def public_methods(cls: type) -> list[str]:
    """A stateful tool class's tools: its public methods (no leading ``_``, not ``close``; inherited ones included,
    ``object``'s not), in definition order."""
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, value in vars(klass).items():
            if inspect.isfunction(value) and not name.startswith("_") and name != "close":
                names[name] = None
    return list(names)


def _schema(fn: Any, target: str) -> dict[str, Any]:
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # noqa: BLE001 - transformers: DocstringParsingException, TypeHintParsingException
        raise ValueError(f"tool {target!r}: no JSON schema from its signature and docstring ({e}); a tool needs a "
                         "type hint on every parameter and a Google-style docstring with an 'Args:' entry for each"
                         ) from None


def resolve_tool(target: str) -> list[Tool]:
    """The :class:`Tool` s a name gives: one for a function, one per public method for a class
    (:func:`public_methods`).

    Errors: those of :func:`resolve_target`; ``ValueError`` when a schema cannot be built (a parameter without a
    type hint, or missing from the docstring's ``Args:``), with transformers' reason; ``TypeError`` for a class
    whose ``__init__`` needs arguments, or that has no public method."""
    obj = resolve_target(target)
    if not inspect.isclass(obj):
        schema = _schema(obj, target)
        return [Tool(target=target, name=schema["function"]["name"], schema=schema, access=tool_access(obj, target))]
    try:
        needs = [p.name for p in inspect.signature(obj).parameters.values()
                 if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        needs = []
    if needs:
        raise TypeError(f"tool {target!r}: {obj.__name__}.__init__ needs the arguments {', '.join(needs)}; a stateful "
                        "tool class is built with no arguments, once per trajectory (give them defaults)")
    methods = public_methods(obj)
    if not methods:
        raise TypeError(f"tool {target!r}: the class {obj.__name__} has no public method (a stateful tool's tools are "
                        "its methods without a leading '_')")
    closes = callable(getattr(obj, "close", None))
    spec = tool_access(obj, target)
    out = []
    for m in methods:  # the schema of the bound method: `self` is not a parameter
        schema = _schema(types.MethodType(getattr(obj, m), object()), f"{target}.{m}")
        out.append(Tool(target=target, name=schema["function"]["name"], schema=schema, method=m, owner=obj.__name__,
                        closes=closes, access=spec))  # fmt: skip
    return out


def resolve_tools(targets: tuple[str, ...] | list[str]) -> list[Tool]:
    """Each name resolved (a class gives one tool per public method); ``ValueError`` when two resolve to the same
    called name."""
    tools = [tool for t in targets for tool in resolve_tool(t)]
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
