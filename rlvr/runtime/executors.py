"""Executors run the role classes (engines, reward worker, trainer ranks) in-process or as Ray actors.

The role classes are plain Python. ``LocalExecutor`` constructs them in this process and runs each call on a
thread (so that a weight sync's sender and receivers can wait on each other); breakpoints work. ``RayExecutor``
wraps each in a Ray actor (one machine or a cluster). ``import ray`` lives in this module only.

Both return :class:`Handle` objects: ``handle.call("method", *args)`` starts a call and returns a future;
``executor.get(futures, timeout_s, what)`` waits for all of them and raises :class:`RoleError` naming the role and
the call when one fails or the timeout passes.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rlvr.console import ROLE_LOG_FORMAT, route_role_output
from rlvr.environ import clean_env, env_difference, recording_env, restore_env, scoped_env
from rlvr.hardware import host_ip
from rlvr.runtime.codepath import by_value, driver_packages, pin_hook
from rlvr.runtime.waits import Waits

log = logging.getLogger(__name__)


class RoleError(RuntimeError):
    """A call on a role (engine, reward worker, trainer rank) failed or timed out. ``role``: the role's name when
    known; ``died``: True when its process is gone (a Ray actor died), so a new one may be started;
    ``timed_out``: True when the deadline passed."""

    def __init__(self, message: str, role: str | None = None, died: bool = False, timed_out: bool = False):
        super().__init__(message)
        self.role, self.died, self.timed_out = role, died, timed_out


def _overran(what: str, role: str | None, method: str | None, timeout_s: float | None, setting: str | None) -> RoleError:
    who = f"{role}.{method}" if role else "a call"
    fix = f": raise {setting} if it needs longer, or find why {role or 'it'} is stuck (its log)" if setting else ""
    return RoleError(f"{what}: {who} did not finish within {timeout_s:g}s{fix}", role, timed_out=True)


def _left(deadline: float | None) -> float | None:
    """Seconds to a monotonic ``deadline`` (None: no deadline); the deadline covers a whole wait, not each call."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _deadline(timeout_s: float | None) -> float | None:
    return None if timeout_s is None else time.monotonic() + timeout_s


@dataclass(frozen=True)
class Resources:
    """What one role needs: CPUs (fractional allowed), GPUs, Ray custom resources (``custom``), environment
    variables set before it starts, and where it goes: bundle ``bundle`` of the placement group ``group``
    (:meth:`RayExecutor.reserve`; None: wherever Ray puts it); ``concurrency``: how many of its calls may run at once
    (1: one at a time, in order, as an actor; more: a threaded actor, for a role that answers calls while one
    waits, e.g. an engine with in-flight weight updates taking a sync while its batches run)."""

    num_cpus: float = 0.1
    num_gpus: float = 0.0
    env: dict[str, str] = field(default_factory=dict)
    custom: dict[str, float] = field(default_factory=dict)
    group: str | None = None
    bundle: int = 0
    concurrency: int = 1

    def bundle_dict(self) -> dict[str, float]:
        """The placement-group bundle that holds exactly this role."""
        return {"CPU": self.num_cpus, **({"GPU": self.num_gpus} if self.num_gpus else {}), **self.custom}


NO_GPU_ENV = {"CUDA_VISIBLE_DEVICES": ""}
"""What a Ray actor that asks for no GPU starts with, so that it sees none: Ray sets ``CUDA_VISIBLE_DEVICES`` for
an actor that holds GPUs, and since ray-project/ray#54868 (Ray 2.60 here) leaves it unset for one that holds none,
which then sees every GPU of its node and may allocate on one that another role holds (a CPU critic or judge beside
GPU roles; torch picks ``cuda:0``)."""


def actor_env(resources: Resources) -> dict[str, str]:
    """The environment variables of a Ray actor of ``resources``: ``resources.env``, plus :data:`NO_GPU_ENV` when
    it asks for no GPU (``num_gpus == 0``). A GPU role's ``CUDA_VISIBLE_DEVICES`` is left to Ray (its GPUs)."""
    return {**resources.env, **(NO_GPU_ENV if resources.num_gpus == 0 else {})}


@dataclass(frozen=True)
class Group:
    """A placement group to reserve: one bundle per role (:meth:`Resources.bundle_dict`), Ray's strategy
    (``PACK``: as few nodes as hold them, ``STRICT_PACK``: one node, ``SPREAD``) and ``settings``, the recipe
    keys that size it (named when it does not fit)."""

    name: str
    bundles: tuple[dict[str, float], ...]
    strategy: str = "PACK"
    settings: str = ""


def fit_bundles(groups: list[Group], nodes: dict[str, dict[str, float]]) -> list[str]:
    """Check that every bundle of ``groups`` fits the cluster's ``nodes`` (node name -> total resources) at
    once: first-fit, largest bundle first, one node per bundle (``STRICT_PACK`` groups: all bundles on one node).
    Returns what is missing, one line per bundle that has no room (empty: everything fits)."""
    free = {n: dict(r) for n, r in nodes.items()}
    items: list[tuple[str, list[dict[str, float]]]] = []
    for g in groups:
        if g.strategy == "STRICT_PACK":
            total: dict[str, float] = {}
            for b in g.bundles:
                for k, v in b.items():
                    total[k] = total.get(k, 0.0) + v
            items.append((f"{g.name} (all {len(g.bundles)} on one node)", [total]))
        else:
            items.extend((f"{g.name}[{i}]", [b]) for i, b in enumerate(g.bundles))
    key = lambda it: (-it[1][0].get("GPU", 0.0), -sum(it[1][0].values()))  # noqa: E731
    missing = []
    for what, (need,) in sorted(items, key=key):
        for n in free:
            if all(free[n].get(k, 0.0) + 1e-9 >= v for k, v in need.items()):
                for k, v in need.items():
                    free[n][k] -= v
                break
        else:
            ask = ", ".join(f"{k} {v:g}" for k, v in need.items())
            missing.append(f"{what} needs {{{ask}}} on one node")
    return missing


RESERVE_LOG_EVERY_S = 30.0
"""How often :meth:`RayExecutor.reserve` logs the placement groups it still waits for (seconds)."""


def shown_resources(res: dict[str, float]) -> str:
    """``{CPU 0.3, GPU 1}``: the resources a recipe asks for, sorted; node markers (``node:IP``), memory and
    Ray's placement-group bookkeeping (``CPU_group_<id>``, ``bundle_group_<id>``) left out."""
    keep = [(k, v) for k, v in sorted(res.items())
            if not k.startswith(("node:", "bundle_group")) and "memory" not in k and "_group_" not in k]  # fmt: skip
    return "{" + ", ".join(f"{k} {v:g}" for k, v in keep) + "}"


def _per_node(nodes: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{n}: {shown_resources(r)}" for n, r in nodes.items()) or "no alive node"


def _held(holders: list[str]) -> str:
    return "; ".join(holders) if holders else "nothing rlvr can name (`ray status` shows the cluster)"


def reserve_problems(groups: list[Group], totals: dict[str, dict[str, float]], free: dict[str, dict[str, float]],
                     holders: list[str]) -> tuple[str | None, str | None]:
    """What stands in the way of reserving ``groups``: ``(error, warning)``, each None when there is none.

    ``totals``/``free``: node -> its total / currently unreserved resources; ``holders``: what holds resources
    now (other placement groups, actors), one description each. ``error``: some bundle fits no node even with
    the whole cluster free (:func:`fit_bundles` on ``totals``): names each such bundle and what it asks, the
    nodes' totals and free resources, and the recipe keys that size its group (:attr:`Group.settings`).
    ``warning`` (no error): everything fits the totals but not what is free now (:func:`fit_bundles` on
    ``free``): names the bundles that wait, the free resources and the holders."""
    missing = fit_bundles(groups, totals)
    if missing:
        named = [g for g in groups if g.settings and any(m.startswith((f"{g.name}[", f"{g.name} (")) for m in missing)]
        keys = "; ".join(f"{g.name}: {g.settings}" for g in named)
        fix = f"lower the recipe keys that size them ({keys})" if keys else "ask for less in the recipe"
        return (
            "the recipe asks for more than the Ray cluster has: " + "; ".join(missing) + ". The cluster's nodes: "
            f"{_per_node(totals)}; free now: {_per_node(free)}. Fix: {fix}, add nodes, or start nodes with the "
            "custom resources the recipe names (ray start --resources)",
            None,
        )
    busy = fit_bundles(groups, free)
    if busy:
        return None, (
            "the placement groups fit the cluster but not what is free now: " + "; ".join(busy) + f". Free now: "
            f"{_per_node(free)}. Held by: {_held(holders)}. Waiting for them to be released"
        )
    return None, None


def waiting_message(waited_s: float, pending: list[Group], free: dict[str, dict[str, float]], holders: list[str],
                    timeout_s: float, setting: str | None) -> str:
    """The periodic line of a placement-group wait: how long so far (of ``timeout_s``, the recipe key
    ``setting``), each group still pending with what its bundles ask, the free resources per node and what holds
    the rest."""
    asks = "; ".join(f"{g.name} ({len(g.bundles)} x " + ", ".join(shown_resources(b) for b in g.bundles) + ")"
                     for g in pending)  # fmt: skip
    limit = f"{timeout_s:g}s, {setting}" if setting else f"{timeout_s:g}s"
    return (f"waiting {waited_s:.0f}s (of at most {limit}) for placement groups: {asks}. Free now: "
            f"{_per_node(free)}. Held by: {_held(holders)}")


@dataclass
class _Call:
    role: str
    method: str
    future: Any
    timed: bool = True  # the future yields (result, start, end): see _timed


@dataclass(frozen=True)
class Span:
    """One call as the role ran it: ``start``/``end`` in wall-clock seconds (``time.time()``, taken inside the
    role's process: comparable across processes of one machine, and across nodes as far as their clocks agree)."""

    role: str
    method: str
    start: float
    end: float


def _timed(obj: Any, method: str, args: tuple, kwargs: dict) -> tuple[Any, float, float]:
    """Run ``obj.method(*args, **kwargs)`` and return (result, start, end): every call's busy interval, measured
    where it runs (the controller's view would include queueing behind the role's earlier calls)."""
    t0 = time.time()
    out = getattr(obj, method)(*args, **kwargs)
    return out, t0, time.time()


class Timeline:
    """The :class:`Span` of every call an executor's ``get`` returned, in completion order (thread-safe). The
    controller reads the spans of each step (:meth:`since`) for the roles' busy and idle seconds
    (:func:`rlvr.metrics.timeline.role_usage`)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()

    def add(self, call: "_Call", start: float, end: float) -> None:
        with self._lock:
            self.spans.append(Span(call.role, call.method, start, end))

    def since(self, t: float) -> list[Span]:
        """Spans that ended after wall-clock time ``t``."""
        with self._lock:
            return [s for s in self.spans if s.end > t]

    def trim(self, t: float) -> None:
        """Forget spans that ended before ``t`` (a long run keeps only what the current step reads)."""
        with self._lock:
            self.spans = [s for s in self.spans if s.end > t]


def _unwrap(call: "_Call", value: Any, timeline: "Timeline") -> Any:
    if not call.timed:
        return value
    out, start, end = value
    timeline.add(call, start, end)
    return out


class Handle:
    def __init__(self, name: str, target: Any, executor: "LocalExecutor | RayExecutor"):
        self.name, self._target, self._ex = name, target, executor

    def call(self, method: str, *args: Any, **kwargs: Any) -> _Call:
        return _Call(self.name, method, self._ex._submit(self._target, method, args, kwargs))


class _Waiting:
    """``get``/``as_completed`` of both executors, each recorded in :attr:`waits` while it blocks (what the
    progress heartbeat reports a long step waiting on); the executor's ``_get``/``_as_completed`` do the work."""

    @property
    def waits(self) -> Waits:
        """The waits open now (:class:`rlvr.runtime.waits.Waits`)."""
        if "_waits" not in self.__dict__:
            self.__dict__["_waits"] = Waits()
        return self.__dict__["_waits"]

    def get(self, calls: list[_Call], timeout_s: float | None, what: str, setting: str | None = None) -> list[Any]:
        """Results of ``calls`` in order, all within ``timeout_s`` seconds in total. ``setting``: the recipe key
        that sets this deadline (named in the error). Errors: :class:`RoleError` naming the role and call."""
        with self.waits.waiting(what, (c.role for c in calls)):
            return self._get(calls, timeout_s, what, setting)

    def as_completed(self, calls: list[_Call], timeout_s: float | None, what: str, setting: str | None = None):
        """Yield ``(position in calls, result)`` as calls finish (first finished first), all within ``timeout_s``."""
        with self.waits.waiting(what, (c.role for c in calls)):
            yield from self._as_completed(calls, timeout_s, what, setting)


class LocalExecutor(_Waiting):
    """Roles as objects in this process. Like an actor, each role has one thread of its own: it is built there and
    runs its calls there, one at a time (vLLM's CPU kernels check that the OpenMP thread count of a call matches
    the one its batch metadata was built with, which differs between fresh threads); a role of ``concurrency`` k
    has k threads (an in-flight engine runs its model in its own loop thread). The roles share this
    process's devices: a role without GPUs is not hidden from them here, as it is under Ray (:func:`actor_env`)."""

    def __init__(self) -> None:
        self._threads: list[cf.ThreadPoolExecutor] = []
        self._roles: list[tuple[cf.ThreadPoolExecutor, cf.Future]] = []  # (its thread, the object being built)
        self.timeline = Timeline()
        self._env_before: dict[str, str | None] = {}
        """What the roles changed in this process's environment (variable -> earlier value): undone at shutdown."""

    def spawn(self, name: str, cls: type, *args: Any, resources: Resources = Resources(), **kwargs: Any) -> Handle:
        # every role shares this process's environment: the first role's value of a variable holds until shutdown
        with recording_env(self._env_before):
            for k, v in resources.env.items():
                os.environ.setdefault(k, v)
        thread = cf.ThreadPoolExecutor(max_workers=max(1, resources.concurrency), thread_name_prefix=f"rlvr-{name}")
        self._threads.append(thread)
        target = (thread, thread.submit(self._construct, cls, args, kwargs))
        self._roles.append(target)
        return Handle(name, target, self)

    _BUILD_LOCK = threading.Lock()

    def _construct(self, cls: type, args: tuple, kwargs: dict) -> Any:
        # one role is built at a time: model loading (transformers, vLLM) touches process-global state, and two
        # loads on two threads were seen to fail ("Cannot copy out of meta tensor"); roles' calls still overlap.
        # What the build writes into os.environ (vLLM's LD_PRELOAD, a trainer's MASTER_ADDR, ...) is recorded.
        with self._BUILD_LOCK, recording_env(self._env_before):
            return cls(*args, **kwargs)

    SHUTDOWN_S = 60.0
    """Seconds :meth:`shutdown` waits for one role's own ``shutdown`` (an engine stopping its core and workers)."""

    BUILD_METHODS = ("setup",)
    """Methods that load models (a role's second construction phase): run one at a time, as constructors are."""

    def _submit(self, target: tuple[cf.ThreadPoolExecutor, cf.Future], method: str, args: tuple, kwargs: dict) -> cf.Future:
        thread, obj = target

        def run():
            if method in self.BUILD_METHODS:
                with self._BUILD_LOCK, recording_env(self._env_before):
                    return _timed(obj.result(), method, args, kwargs)
            return _timed(obj.result(), method, args, kwargs)

        return thread.submit(run)

    def _get(self, calls: list[_Call], timeout_s: float | None, what: str, setting: str | None = None) -> list[Any]:
        out, deadline = [], _deadline(timeout_s)
        for c in calls:
            try:
                out.append(_unwrap(c, c.future.result(timeout=_left(deadline)), self.timeline))
            except cf.TimeoutError:
                raise _overran(what, c.role, c.method, timeout_s, setting) from None
            except Exception as e:
                raise RoleError(f"{what}: {c.role}.{c.method} failed: {type(e).__name__}: {e}") from e
        return out

    def _as_completed(self, calls: list[_Call], timeout_s: float | None, what: str, setting: str | None = None):
        pos = {c.future: i for i, c in enumerate(calls)}
        done: set[int] = set()
        try:
            for f in cf.as_completed(list(pos), timeout=timeout_s):
                i = pos[f]
                done.add(i)
                yield i, self.get([calls[i]], 0, what)[0]
        except cf.TimeoutError:
            late = next((c for i, c in enumerate(calls) if i not in done), None)
            raise _overran(what, late.role if late else None, late.method if late else None, timeout_s, setting) from None

    def reserve(self, groups: list[Group], timeout_s: float, setting: str | None = None) -> None:
        """Nothing to reserve in one process (every role runs here)."""

    def node_ips(self, handles: list[Handle], timeout_s: float) -> list[str]:
        """Every role runs in this process, on this node."""
        return [host_ip() for _ in handles]

    def kill(self, handle: Handle) -> None:
        """Errors: :class:`RoleError`: a role in this process cannot be killed and replaced."""
        raise RoleError(f"the local executor cannot restart {handle.name}: use run.executor=ray", handle.name)

    def shutdown(self) -> None:
        """Stop each role's engine (the role's own ``shutdown``, where it has one, in the role's thread, within
        :data:`SHUTDOWN_S`), the roles' threads, and give this process's environment back as it was before the
        first spawn (the variables the roles set or changed, :mod:`rlvr.environ`): a ``ray start`` or
        child process started afterwards does not inherit them."""
        for thread, obj in self._roles:  # a role with an engine in this process stops it now (VLLMEngine.shutdown)
            if obj.done() and obj.exception() is None and callable(getattr(obj.result(), "shutdown", None)):
                try:
                    thread.submit(obj.result().shutdown).result(timeout=self.SHUTDOWN_S)
                except Exception as e:  # noqa: BLE001 - shutting down: never hide the error that led here
                    log.warning("stopping a role's engine: %s: %s", type(e).__name__, e)
        self._roles.clear()
        for t in self._threads:
            t.shutdown(wait=False, cancel_futures=True)
        self._threads.clear()
        restore_env(self._env_before)
        self._env_before.clear()


class RayExecutor(_Waiting):
    """Roles as Ray actors. Starts a local Ray (``address=None``) or joins a cluster (``"auto"`` or an address).
    Its roles import the driver's ``rlvr`` and ``rlvr_verifiers`` (:mod:`rlvr.runtime.codepath`), whatever the
    working directory holds."""

    def __init__(self, address: str | None, num_cpus: float | None, env: dict[str, str]) -> None:
        import ray

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        # inside a `ray job submit` job, let the roles' env vars override the job's instead of failing to merge
        os.environ.setdefault("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
        self._started = not ray.is_initialized()
        if self._started:
            kwargs: dict[str, Any] = dict(
                # None: a Ray of our own. Ray's own None joins the last `ray start` of this machine, even one that
                # died since (a stale /tmp/ray/ray_current_cluster: the driver then aborted without a word)
                address=address if address is not None else "local",
                include_dashboard=False,
                log_to_driver=True,
                # every role imports the driver's rlvr, not a checkout in the working directory that Ray puts
                # first on the workers' sys.path (rlvr.runtime.codepath)
                runtime_env={"env_vars": env, "worker_process_setup_hook": pin_hook(driver_packages(), ROLE_LOG_FORMAT)},
                configure_logging=False,
            )
            if address is None and num_cpus is not None:
                kwargs["num_cpus"] = num_cpus
            by_value()  # the hook goes by value: a worker must not import rlvr to run it
            # a Ray of our own starts its raylet from this process's environment: without what roles built in
            # this process left there (their settings are the runtime_env's)
            with scoped_env(*env_difference(clean_env())):
                ray.init(**kwargs)
        else:
            log.debug("Ray was started before this executor: the roles import rlvr as that job's workers do "
                      "(rlvr.runtime.codepath pins it only in a Ray rlvr starts or joins itself)")
        # the actors' stdout/stderr: every line to RUN/train.log, known third-party noise left off the console
        if not route_role_output():
            log.debug("the roles' output is Ray's to print: no ray_print_logs handler to route (log_to_driver off?)")
        self._ray = ray
        self.timeline = Timeline()
        self._actors: list[Any] = []
        self._groups: dict[str, Any] = {}

    def nodes(self) -> dict[str, dict[str, float]]:
        """Alive nodes of the cluster: ``"IP (node id prefix)"`` -> total resources."""
        return {f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})": dict(n.get("Resources", {}))
                for n in self._ray.nodes() if n.get("Alive")}  # fmt: skip

    def free_resources(self) -> dict[str, dict[str, float]]:
        """Alive nodes (named as :meth:`nodes` names them) -> resources not reserved or in use now. Per node from
        Ray's GCS (``ray._private.state.available_resources_per_node``, internal); if that is unavailable, one
        entry for the whole cluster (``ray.available_resources()``)."""
        try:
            from ray._private import state

            per_node = state.available_resources_per_node()
            names = {n["NodeID"]: f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})" for n in self._ray.nodes() if n.get("Alive")}
            return {names[k]: dict(v) for k, v in per_node.items() if k in names}
        except Exception as e:  # noqa: BLE001 - an internal API: fall back to the cluster's sum
            log.debug("free resources per node: %s", e)
            return {"the cluster (all nodes)": dict(self._ray.available_resources())}

    def holders(self, limit: int = 8) -> list[str]:
        """What holds cluster resources now, other than this executor: placement groups (id prefix, name, state,
        bundles) and alive actors (class, job), at most ``limit`` of each kind. Empty when Ray cannot say."""
        out: list[str] = []
        try:
            ours = {pg.id.hex() for pg in self._groups.values()}
            from ray.util import placement_group_table

            table = placement_group_table()
            others = [g for k, g in table.items() if k not in ours and g.get("state") in ("CREATED", "RESCHEDULING")]
            for g in others[:limit]:
                name = f" {g['name']!r}" if g.get("name") else ""
                bundles = ", ".join(shown_resources(b) for b in g.get("bundles", {}).values())
                out.append(f"placement group {g['placement_group_id'][:8]}{name} ({g['state']}: {bundles})")
            if len(others) > limit:
                out.append(f"{len(others) - limit} more placement groups")
            from ray._private import state

            mine = {a._actor_id.hex() for a in self._actors}
            alive = [a for k, a in state.actors().items() if a.get("State") == "ALIVE" and k not in mine]
            for a in alive[:limit]:
                out.append(f"actor {a.get('ActorClassName')} (job {a.get('JobID')})")
            if len(alive) > limit:
                out.append(f"{len(alive) - limit} more actors")
        except Exception as e:  # noqa: BLE001 - a description only; the wait goes on without it
            log.debug("what holds the cluster's resources: %s", e)
        return out

    def reserve(self, groups: list[Group], timeout_s: float, setting: str | None = None) -> None:
        """Create one placement group per :class:`Group` and wait (within ``timeout_s``) until all are placed.

        Checked first (:func:`reserve_problems`) against the nodes' totals: a recipe asking for more than the
        cluster has fails here, naming each bundle without room, the nodes' totals and free resources and the
        recipe keys that size it, instead of waiting; then against what is free now: a warning names the bundles
        that must wait and what holds the resources. While waiting, every :data:`RESERVE_LOG_EVERY_S` seconds a
        line says which groups are pending, what they ask and what is free (:func:`waiting_message`).
        Errors: :class:`RoleError` (does not fit; or not placed in time: resources held by other jobs)."""
        from ray.util.placement_group import placement_group, remove_placement_group

        totals, free = self.nodes(), self.free_resources()
        error, warning = reserve_problems(groups, totals, free, [])
        if error:
            raise RoleError(error)
        if warning:  # only now ask what holds them (a few GCS calls)
            log.warning("%s", reserve_problems(groups, totals, free, self.holders())[1])
        t0 = time.monotonic()
        deadline = _deadline(timeout_s)
        for g in groups:
            self._groups[g.name] = placement_group(list(g.bundles), strategy=g.strategy, name="")
        pending, by_name = dict(self._groups), {g.name: g for g in groups}
        while pending:
            waits = {pg.ready(): name for name, pg in pending.items()}
            left = _left(deadline)
            ready, _ = self._ray.wait(list(waits), num_returns=len(waits),
                                      timeout=RESERVE_LOG_EVERY_S if left is None else min(RESERVE_LOG_EVERY_S, left))  # fmt: skip
            for ref in ready:
                pending.pop(waits[ref], None)
            if not pending:
                break
            if _left(deadline) == 0.0:
                name = next(iter(pending))
                for p in self._groups.values():
                    remove_placement_group(p)
                self._groups.clear()
                raise _overran(f"reserving the placement group {name!r} (resources held by other jobs? `ray status`)",
                               None, None, timeout_s, setting)  # fmt: skip
            log.info("%s", waiting_message(time.monotonic() - t0, [by_name[n] for n in pending], self.free_resources(),
                                           self.holders(), timeout_s, setting))  # fmt: skip

    def node_ips(self, handles: list[Handle], timeout_s: float) -> list[str]:
        """The IP of the node each role's actor runs on (asked inside the actor)."""
        calls = [_Call(h.name, "node_ip", h._target.__ray_call__.remote(lambda _self: host_ip()), timed=False)
                 for h in handles]
        return self.get(calls, timeout_s, "asking the roles where they run")

    def spawn(self, name: str, cls: type, *args: Any, resources: Resources = Resources(), **kwargs: Any) -> Handle:
        """Start ``cls(*args, **kwargs)`` as a Ray actor with ``resources`` (its bundle of a reserved placement
        group, else its custom resources) and the environment :func:`actor_env` (a role without GPUs sees none)."""
        options: dict[str, Any] = {}
        if resources.group is not None and resources.group in self._groups:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self._groups[resources.group], placement_group_bundle_index=resources.bundle
            )
        elif resources.custom:
            options["resources"] = dict(resources.custom)
        actor_cls = self._ray.remote(cls).options(
            num_cpus=resources.num_cpus,
            num_gpus=resources.num_gpus,
            runtime_env={"env_vars": actor_env(resources)},
            max_restarts=0,
            **({"max_concurrency": resources.concurrency} if resources.concurrency > 1 else {}),
            **options,
        )
        actor = actor_cls.remote(*args, **kwargs)
        self._actors.append(actor)
        return Handle(name, actor, self)

    def _submit(self, actor: Any, method: str, args: tuple, kwargs: dict) -> Any:
        # through the actor's __ray_call__ (an actor method like the others: same queue, same order) so the call
        # reports its own start and end
        return actor.__ray_call__.remote(_timed, method, args, kwargs)

    def _get(self, calls: list[_Call], timeout_s: float | None, what: str, setting: str | None = None) -> list[Any]:
        ray = self._ray
        out, deadline = [], _deadline(timeout_s)
        for c in calls:
            try:
                out.append(_unwrap(c, ray.get(c.future, timeout=_left(deadline)), self.timeline))
            except ray.exceptions.GetTimeoutError:
                raise _overran(what, c.role, c.method, timeout_s, setting) from None
            except ray.exceptions.RayActorError as e:
                raise RoleError(f"{what}: the {c.role} actor died during {c.method}: {e}", c.role, died=True) from e
            except ray.exceptions.RayTaskError as e:
                cause = e.cause if getattr(e, "cause", None) is not None else e
                raise RoleError(f"{what}: {c.role}.{c.method} failed: {type(cause).__name__}: {cause}") from e
        return out

    def _as_completed(self, calls: list[_Call], timeout_s: float | None, what: str, setting: str | None = None):
        pending = {c.future: i for i, c in enumerate(calls)}
        deadline = _deadline(timeout_s)
        while pending:
            ready, _ = self._ray.wait(list(pending), num_returns=1, timeout=_left(deadline))
            if not ready:
                late = calls[next(iter(pending.values()))]
                raise _overran(what, late.role, late.method, timeout_s, setting)
            i = pending.pop(ready[0])
            yield i, self.get([calls[i]], None, what)[0]

    def kill(self, handle: Handle) -> None:
        """Kill a role's actor (no Ray restart); the caller spawns its replacement."""
        try:
            self._ray.kill(handle._target, no_restart=True)
        except Exception as e:  # already gone
            log.debug("kill %s: %s", handle.name, e)
        self._actors = [a for a in self._actors if a is not handle._target]

    def shutdown(self) -> None:
        for a in self._actors:
            try:
                self._ray.kill(a)
            except Exception:
                pass
        self._actors.clear()
        from ray.util.placement_group import remove_placement_group

        for pg in self._groups.values():
            try:
                remove_placement_group(pg)
            except Exception:
                pass
        self._groups.clear()
        if self._started:
            self._ray.shutdown()

