"""The process environment around roles built in this process: scoped settings, and a clean copy for new raylets.

Roles built in the driver's process (the local executor; engines a test builds directly) change ``os.environ``: rlvr's
own settings for vLLM (set here only for the engine's construction, :func:`scoped_env`), and what vLLM and
torch.distributed write there themselves (a CPU engine's start sets ``LD_PRELOAD``, ``LOCAL_WORLD_SIZE``,
``VLLM_DIST_IDENT``, ``VLLM_WORKER_MULTIPROC_METHOD``, ...; a trainer rank ``MASTER_ADDR``, ``RANK``, ...). Every
child started afterwards inherits them, a ``ray start`` raylet and all its workers included: a Ray actor then runs
with another role's settings. :func:`recording_env` remembers what such code changed, and :func:`clean_env` gives
the environment without it, for the processes that must start clean.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RUN_ID")  # fmt: skip
"""torch.distributed's launcher variables (``env://`` rendezvous): one process's place in one group, never
meant for a process that starts others (a raylet)."""

COMM_ENV = ("NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",
            "NCCL_NET_GDR_LEVEL", "NCCL_CUMEM_ENABLE", "NCCL_DEBUG", "GLOO_SOCKET_IFNAME")  # fmt: skip
"""Communication settings that must agree on every rank of one group: the trainer ranks' data-parallel group and
the weight-sync group of trainer rank 0 and every engine worker (a rank on another network interface, or with
InfiniBand, peer-to-peer or cuMem allocation on where its peers have it off, hangs or fails the group's first
collective). Their one home: :func:`comm_env` forwards the launcher's values (the driver's ``os.environ``) to every
role (:func:`rlvr.runtime.roles.role_env`), and ``launch/submit.sh`` carries the same names into a Ray job's
environment (its ``PASS_ENV``; tests/unit/test_gpu_env.py holds the two lists together). rlvr sets none of them
itself; unset here, each role keeps its node's own value (or NCCL's default)."""

_lock = threading.Lock()
_before: dict[str, str | None] = {}
"""Variable -> its value before code run for a role in this process first changed it (None: it was unset)."""


@contextmanager
def scoped_env(values: Mapping[str, str], unset: Iterable[str] = ()) -> Iterator[None]:
    """Set ``values`` and remove ``unset`` in ``os.environ`` for the body only; afterwards each of those variables
    has its earlier value again (or is unset again), whatever the body did to it. Other variables are left as the
    body left them."""
    keys = set(values) | set(unset)
    old = {k: os.environ.get(k) for k in keys}
    for k in unset:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        _restore(old)


@contextmanager
def recording_env(into: dict[str, str | None] | None = None) -> Iterator[None]:
    """Run the body (a role's construction or set-up) and remember the earlier value of each variable of
    ``os.environ`` it changed, in this process's record (read by :func:`clean_env`) and in ``into`` (first value
    kept), so that they can be undone (:func:`restore_env`)."""
    old = dict(os.environ)
    try:
        yield
    finally:
        new = os.environ
        changed = {k: old.get(k) for k in set(old) | set(new) if old.get(k) != new.get(k)}
        with _lock:
            for k, v in changed.items():
                _before.setdefault(k, v)
                if into is not None:
                    into.setdefault(k, v)


def restore_env(before: Mapping[str, str | None]) -> None:
    """Give each variable of ``before`` that value again (None: unset it) and drop it from this process's record."""
    _restore(before)
    with _lock:
        for k in before:
            _before.pop(k, None)


def clean_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) for a process that must not inherit the roles built here (a
    raylet, a fresh driver): each variable such code changed (:func:`recording_env`) at its earlier value, and
    torch.distributed's launcher variables (:data:`DIST_ENV`) left out."""
    env = dict(os.environ if base is None else base)
    with _lock:
        for k, v in _before.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
    for k in DIST_ENV:
        env.pop(k, None)
    return env


def env_difference(target: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(set, unset) that turn ``os.environ`` into ``target``, for :func:`scoped_env`: only the variables that
    differ, so that the body's own changes to the others stay."""
    return ({k: v for k, v in target.items() if os.environ.get(k) != v}, [k for k in os.environ if k not in target])


def _restore(old: Mapping[str, str | None]) -> None:
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def comm_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The :data:`COMM_ENV` variables set in ``base`` (default ``os.environ``, the launcher's), to be set alike in
    every role's environment."""
    env = os.environ if base is None else base
    return {k: env[k] for k in COMM_ENV if k in env}
