"""Every Ray role runs the driver's rlvr: the packages ``rlvr`` and ``rlvr_verifiers`` pinned to the folders the
driver imported them from.

Ray puts the driver's working directory first on each worker's ``sys.path`` (``JobConfig.py_driver_sys_path``,
set by ``ray.init`` in a script; the worker inserts it when it takes its first task). A driver started from
inside a second clone of rlvr (``cd other-clone && rlvr train ...``, where ``rlvr`` is an installed console
script, so the clone is not on the driver's own path) then ran the installed package while its actors imported
the clone's ``rlvr/``: two commits in one run, silently.

:func:`pin_hook` makes the job-level ``worker_process_setup_hook`` (:class:`rlvr.runtime.executors.RayExecutor`
passes it to ``ray.init``): at each worker's start it puts a finder first on ``sys.meta_path`` that answers
``import rlvr`` / ``import rlvr_verifiers`` with the driver's folders, whatever ``sys.path`` holds by then; and,
when the first such import comes (after Ray's insertion), it puts the folder holding the driver's package ahead
of any entry of ``sys.path`` that holds another one, so that processes the role starts (the reward pool's
forkserver/spawn workers, vLLM's workers: they copy ``sys.path``, not ``sys.meta_path``) import the same.
A node where the driver's folder does not exist (another machine's layout) keeps its own import path.

This module is pickled by value (the hook must not import ``rlvr`` to run): it imports nothing of rlvr.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from typing import Callable

PINNED = ("rlvr", "rlvr_verifiers")
"""The packages every role imports from the driver's folders."""


def driver_packages() -> dict[str, str]:
    """Package name -> the folder this process imports it from (``rlvr``: ``Path(rlvr.__file__).parent``;
    ``rlvr_verifiers`` found without importing it), for the packages of :data:`PINNED` that it finds."""
    out: dict[str, str] = {}
    for name in PINNED:
        mod = sys.modules.get(name)
        origin = getattr(mod, "__file__", None) if mod is not None else None
        if origin is None:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
        if origin and os.path.basename(origin) == "__init__.py":
            out[name] = os.path.dirname(os.path.abspath(origin))  # as imported (a symlinked folder keeps its name)
    return out


class PinnedFinder:
    """A ``sys.meta_path`` finder: the top-level packages of ``folders`` (name -> folder holding its
    ``__init__.py``) come from those folders; their submodules follow the package's ``__path__``. A folder missing
    on this machine is not answered (the usual search goes on)."""

    def __init__(self, folders: dict[str, str]) -> None:
        self.folders = dict(folders)

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001 - importlib's protocol
        folder = self.folders.get(fullname)
        init = os.path.join(folder, "__init__.py") if folder else None
        if init is None or not os.path.isfile(init):
            return None
        put_first(fullname, folder)
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[folder])


def put_first(name: str, folder: str, path: list[str] | None = None) -> None:
    """Put the parent of ``folder`` (the package ``name``'s folder) on ``path`` (default ``sys.path``) ahead of
    the first entry that holds another package or module ``name``; nothing when none does, or when ``folder`` is
    not named ``name`` (an editable install's ``verifiers/`` for ``rlvr_verifiers``: only the finder pins it)."""
    path = sys.path if path is None else path
    if os.path.basename(folder) != name:
        return
    root, real = os.path.dirname(folder), os.path.realpath(folder)
    for i, entry in enumerate(path):
        base = os.path.join(entry or os.getcwd(), name)
        if os.path.realpath(base) == real and os.path.isfile(os.path.join(base, "__init__.py")):
            return  # the driver's comes first already
        if os.path.isfile(os.path.join(base, "__init__.py")) or os.path.isfile(base + ".py"):
            path.insert(i, root)
            return


def pin_hook(folders: dict[str, str], log_format: str | None = None) -> Callable[[], None]:
    """The ``worker_process_setup_hook`` that installs a :class:`PinnedFinder` for ``folders`` (from
    :func:`driver_packages`) first on the worker's ``sys.meta_path``; with ``log_format``, it also gives the
    worker's ``rlvr`` logger a handler on stderr at INFO in that format (:func:`role_log_handler`), so that rlvr's
    records in a role reach the driver (Ray forwards the actors' stderr) and ``RUN/train.log``. Ray pickles it (by
    value: see :func:`by_value`)."""
    folders = dict(folders)

    def pin_driver_packages() -> None:
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "PinnedFinder"]
        sys.meta_path.insert(0, PinnedFinder(folders))
        if log_format is not None:
            role_log_handler(log_format)

    return pin_driver_packages


def role_log_handler(log_format: str) -> None:
    """In a role's process: records of the ``rlvr`` loggers at INFO and above go to stderr in ``log_format``
    (once: nothing is added where the ``rlvr`` logger has a handler already); they do not propagate to the root
    logger (a second copy where Ray or a library gave the root a handler)."""
    logger = logging.getLogger("rlvr")
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(log_format))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def by_value() -> None:
    """Have cloudpickle (Ray's) send this module's functions and classes by value: the hook runs in workers that
    must not import ``rlvr`` to get it."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
