"""User files named in a recipe: ``path/to/file.py:Name`` targets of verifiers (``reward.verifiers``), environments
(``environment.name``) and tools (``tools.names``), loaded the same way for all three.

A file is imported as a module cached in ``sys.modules`` under a name made from its full path
(``rlvr_user_verifier_<stem>_<sha1[:10]>``, the name pickles of a user's environment state and the tool workers rely
on), so a file is executed once per process and every worker that loads it gives its classes the same module.
This module imports nothing of rlvr: the verifier, environment and tool layers all stand on it.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any


def load_file(path_text: str, kind: str = "verifier") -> Any:
    """Import a Python file as a module (cached in ``sys.modules`` under a name derived from its full path).
    ``kind``: what the file holds (``verifier``, ``environment``, ``tool``), named in the errors.
    Errors: ``FileNotFoundError`` naming the nearest ``.py`` file of its folder; ``ImportError``."""
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        near = difflib.get_close_matches(path.name, sorted(p.name for p in path.parent.glob("*.py")), n=1) \
            if path.parent.is_dir() else []
        hint = f" Did you mean {str(Path(path_text).parent / near[0])!r}?" if near else ""
        raise FileNotFoundError(f"{kind} file {path_text!r} not found (resolved to {path}).{hint}")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    mod_name = f"rlvr_user_verifier_{path.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {kind} file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]
        raise
    return module


def missing_attribute(kind: str, name: str, target: str, obj: Any, attr: str) -> AttributeError:
    """The error for ``name`` (a ``module:attr`` or ``file.py:attr`` target of a ``kind``: verifier, environment,
    tool) whose module (or object) ``obj``, named ``target``, has no ``attr``: names the nearest public name it has
    (a class or function typo: ``Feedbak`` -> ``Feedback``)."""
    near = difflib.get_close_matches(attr, [n for n in dir(obj) if not n.startswith("_")], n=1)
    hint = f" Did you mean {target}{'.' if ':' in target else ':'}{near[0]}?" if near else ""
    return AttributeError(f"{kind} {name!r}: {target} has no attribute {attr!r}.{hint}")


def is_file_target(name: str) -> bool:
    """True when ``name`` is ``path/to/file.py:attr`` (a path before the last colon)."""
    target = name.rpartition(":")[0]
    return target.endswith(".py") or "/" in target or "\\" in target
