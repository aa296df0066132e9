"""The tool environment: an environment runner (:class:`rlvr.envs.turns.EnvRunner`) that answers a reply's tool calls
with ``tool`` messages and hands a reply without calls to the recipe's environment, or ends the trajectory there
when the recipe has none (the final answer, scored by the recipe's verifiers as for any environment).

Per round of the turn loop (:func:`rlvr.envs.turns.run_turns`) every live trajectory's reply is parsed in this
process (:mod:`rlvr.tools.formats`); the calls of all of them are checked against their tools' schemas and run in
one batch on the :class:`~rlvr.tools.execute.ToolPool` (in parallel, each bounded), then each trajectory gets one
``tool`` message per call, in the order of its calls. A malformed call (not JSON, an unknown tool, arguments that do
not fit the schema, over ``max_calls_per_turn``) is answered with a message saying what was wrong and is not run.

The tools are listed for the model by the chat template's own ``tools=`` rendering (the renderer carries
``tools=[schemas]`` in its template arguments) or, for a template without one, by a system message
(:func:`rlvr.tools.formats.describe_tools`): :meth:`ToolRunner.reset` returns the opening with it, so the first
prompt is rendered the way every later turn is.

Stateful tools (:mod:`rlvr.tools.registry`: a class whose methods are the tools) get one instance per trajectory
and class, created in a tool worker at the trajectory's first call of one of its methods and kept, pickled, in the
trajectory's state (:class:`ToolState`) between calls: a worker unpickles it, runs the method, pickles it back with
the result. A call that fails (raises, times out, crashes its worker, or leaves an instance that does not pickle)
leaves the state as it was before the call; the model is told the error. Calls of one reply to the same instance
run one after another, in the reply's order (each with its own time limit); calls to different instances and plain
functions run in parallel. When the trajectory ends, however it ends, the turn loop calls :meth:`ToolRunner.release`
and each instance's ``close()`` (when its class has one) runs once, in a tool worker with the call time limit; a
``close()`` that fails is counted (``<Class>/close_error``) and logged, never raised.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from rlvr.envs.base import EnvStep
from rlvr.envs.tokens import Message
from rlvr.tools.execute import OUTCOMES
from rlvr.tools.formats import ParsedCall, parse_calls
from rlvr.tools.registry import Tool, check_arguments

log = logging.getLogger("rlvr")

NO_ENVIRONMENT = "tools"
"""The inner state of a trajectory whose recipe has tools and no environment (a reply without calls ends it)."""


@dataclass(frozen=True)
class ToolState:
    """A trajectory's state in the tool environment: ``inner`` the inner environment's state (:data:`NO_ENVIRONMENT`
    without one); ``instances``: the trajectory's stateful tool instances by class target (the recipe's name for the
    class), each as its pickle; a class appears once the trajectory has called one of its methods."""

    inner: Any
    instances: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolSettings:
    """``fmt``: the call format (:data:`rlvr.tools.formats.FORMATS`); ``max_calls_per_turn``: calls run per reply
    (the rest are answered with an error); ``system``: the system text listing the tools when the chat template does
    not (None: the template lists them); ``call_ids``: the template needs a ``tool_call_id`` on every tool message
    (Mistral's: 9 alphanumeric characters), so a call without such an id of its own gets one made from the call
    (:func:`call_id`). A call's own id is carried as ``tool_call_id`` either way."""

    fmt: str
    max_calls_per_turn: int = 4
    system: str | None = None
    call_ids: bool = False


_CALL_ID = re.compile(r"[A-Za-z0-9]{9}")


def call_id(history_len: int, k: int, raw: str) -> str:
    """A deterministic 9-character id (hex digits) for the ``k``-th call of the reply at message ``history_len``
    (0-based) of the conversation, ``raw`` its text: the first 9 hex digits of
    ``sha256(f"{history_len}:{k}:{raw}")``."""
    return hashlib.sha256(f"{history_len}:{k}:{raw}".encode()).hexdigest()[:9]


class ToolRunner:
    """The tool environment (module docstring). ``pool``: runs calls (:class:`~rlvr.tools.execute.ToolPool`, or
    anything with its ``run``, ``create`` and ``close_instances``); ``inner``: the recipe's environment runner, or
    None.

    Counters (:meth:`counters`): ``trajectories``, ``calls`` (parsed calls, run or not), ``malformed``, and per tool
    ``<name>/ok``, ``<name>/error``, ``<name>/timeout``, ``<name>/crashed``; per stateful tool class
    ``<Class>/created``, ``<Class>/create_error``, ``<Class>/closed``, ``<Class>/close_error``; ``seconds``: wall
    time in the pool."""

    def __init__(self, tools: list[Tool], settings: ToolSettings, pool: Any, inner: Any = None) -> None:
        self.tools = {t.name: t for t in tools}
        self.classes = {t.target: t for t in tools if t.stateful}  # one Tool per stateful class, by target
        self.settings, self.pool, self.inner = settings, pool, inner
        self.stats: collections.Counter[str] = collections.Counter()
        for name in self.tools:  # every tool's outcomes from the first step on (a metric key that appears later
            for outcome in OUTCOMES:  # reads as a missing value in a step's table)
                self.stats[f"{name}/{outcome}"] = 0
        self.seconds = 0.0

    def reset(self, rows: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
        """The inner environment's reset (or a tools-only state), as :class:`ToolState` s with no instances yet; the
        opening is the environment's own or the row's (``row["opening"]``), with the tools' system text when the
        template does not list them."""
        from rlvr.tools.formats import with_system

        self.stats["trajectories"] += len(rows)
        inner = self.inner.reset(rows) if self.inner is not None else [(NO_ENVIRONMENT, [])] * len(rows)
        out: list[tuple[Any, Any]] = []
        for row, (state, opening) in zip(rows, inner):
            if state is None:
                out.append((state, opening))
                continue
            msgs = [dict(m) for m in (opening or row.get("opening") or [])]
            out.append((ToolState(state), with_system(msgs, self.settings.system) if msgs else msgs))
        return out

    def step(self, items: list[tuple[Any, list[Message], Message]]) -> list[tuple[Any, Any]]:
        """One ``(ToolState, EnvStep)`` per item: the calls' results, or the inner environment's step for a reply
        without calls (done without an inner environment)."""
        plans: list[list[tuple[ParsedCall, str | None]]] = []  # per item: (call, error text | None: to run)
        for _, _, reply in items:
            plan = []
            for k, call in enumerate(parse_calls(reply["content"], self.settings.fmt)):
                self.stats["calls"] += 1
                why = self._refuse(call, k)
                if why is not None:
                    self.stats["malformed"] += 1
                plan.append((call, None if why is None else f"error: {why}"))
            plans.append(plan)
        instances = [dict(state.instances) for state, _, _ in items]
        t0 = time.perf_counter()
        done = self._run(plans, instances)
        self.seconds += time.perf_counter() - t0
        answers: dict[int, tuple[Any, Any]] = {}
        rest = [i for i, plan in enumerate(plans) if not plan]
        if self.inner is not None and rest:
            inner_items = [(items[i][0].inner, items[i][1], items[i][2]) for i in rest]
            for i, (state, step) in zip(rest, self.inner.step(inner_items)):
                answers[i] = (ToolState(state, instances[i]) if state is not None else None, step)
        out = []
        for i, ((state, history, _), plan) in enumerate(zip(items, plans)):
            if not plan:
                out.append(answers.get(i, (state, EnvStep([], None, True, {"tool_calls": 0}))))
                continue
            msgs, shown = [], []
            for k, (call, error) in enumerate(plan):
                text, status = (error, "malformed") if error is not None else done[(i, k)]
                msg = {"role": "tool", "name": call.name or "unknown", "content": text}
                if call.id is not None and (not self.settings.call_ids or _CALL_ID.fullmatch(call.id)):
                    msg["tool_call_id"] = call.id
                elif self.settings.call_ids:
                    msg["tool_call_id"] = call_id(len(history), k, call.raw)
                msgs.append(msg)
                shown.append({"name": call.name or "unknown", "call": call.raw[:200], "status": status,
                              "result": text[:200]})
            out.append((ToolState(state.inner, instances[i]), EnvStep(msgs, None, False, {"tool_calls": shown})))
        return out

    def _run(self, plans: list[list[tuple[ParsedCall, str | None]]], instances: list[dict[str, bytes]]
             ) -> dict[tuple[int, int], tuple[str, str]]:
        """Run the calls to run (item i's k-th: ``(text, status)`` by ``(i, k)``), updating ``instances`` (item i's
        instances by class target) in place: first the instances the calls need and the trajectory lacks are
        created, then the calls run in waves, a wave holding at most one call per instance."""
        out: dict[tuple[int, int], tuple[str, str]] = {}
        todo = [(i, k) for i, plan in enumerate(plans) for k, (_, error) in enumerate(plan) if error is None]
        targets = {(i, k): self.tools[plans[i][k][0].name] for i, k in todo}
        need = list(dict.fromkeys((i, tool.target) for (i, _), tool in targets.items()
                                  if tool.stateful and tool.target not in instances[i]))  # fmt: skip
        created = self.pool.create([self.classes[t] for _, t in need]) if need else []
        failed: dict[tuple[int, str], str] = {}
        for (i, target), (blob, why) in zip(need, created):
            owner = self.classes[target].owner
            if blob is not None:
                instances[i][target] = blob
                self.stats[f"{owner}/created"] += 1
            else:
                failed[(i, target)] = why or "unknown"
                self.stats[f"{owner}/create_error"] += 1
        while todo:
            wave, later, busy = [], [], set()
            for i, k in todo:
                tool = targets[(i, k)]
                if tool.stateful and (i, tool.target) in failed:
                    out[(i, k)] = (f"error: {tool.name} could not start: {failed[(i, tool.target)]}", "error")
                    self.stats[f"{tool.name}/error"] += 1
                elif tool.stateful and (i, tool.target) in busy:
                    later.append((i, k))
                else:
                    busy.add((i, tool.target))
                    wave.append((i, k, tool))
            calls = [(tool, plans[i][k][0].arguments) for i, k, tool in wave]
            states = [instances[i][tool.target] if tool.stateful else None for i, _, tool in wave]
            for (i, k, tool), r in zip(wave, self.pool.run(calls, states) if calls else []):
                self.stats[f"{r.name}/{r.status}"] += 1
                if tool.stateful and r.state is not None:
                    instances[i][tool.target] = r.state
                out[(i, k)] = (r.text, r.status)
            todo = later
        return out

    def release(self, states: list[Any]) -> None:
        """Release ended trajectories' stateful tools: ``close()`` once on each instance in ``states`` (their
        :class:`ToolState` s; anything else is skipped) whose class has one, in the tool workers (parallel, the
        call time limit each), then the inner environment's ``release`` when it has one. A failure is counted
        (``<Class>/close_error``) and logged, never raised: a trajectory's end must not fail a rollout."""
        mine = [s for s in states if isinstance(s, ToolState)]
        items = [(self.classes[target], blob) for s in mine for target, blob in s.instances.items()
                 if self.classes[target].closes]  # fmt: skip
        t0 = time.perf_counter()
        try:
            whys: list[str | None] = self.pool.close_instances(items) if items else []
        except Exception as e:  # noqa: BLE001 - a broken pool: every close failed
            whys = [f"{type(e).__name__}: {e}"] * len(items)
        self.seconds += time.perf_counter() - t0
        for (tool, _), why in zip(items, whys):
            if why is None:
                self.stats[f"{tool.owner}/closed"] += 1
            else:
                self.stats[f"{tool.owner}/close_error"] += 1
                log.warning("a stateful tool's close() failed (%s, tool %s): %s", tool.owner, tool.target, why)
        inner_release = getattr(self.inner, "release", None)
        inner = [s.inner for s in mine if s.inner is not None]
        if callable(inner_release) and inner:
            try:
                inner_release(inner)
            except Exception as e:  # noqa: BLE001 - as above
                log.warning("the environment runner's release failed: %s: %s", type(e).__name__, e)

    def _refuse(self, call: ParsedCall, k: int) -> str | None:
        """Why ``call`` (the reply's k-th) is not run, or None."""
        if call.error:
            return call.error
        if k >= self.settings.max_calls_per_turn:
            return (f"not run: at most {self.settings.max_calls_per_turn} tool calls per reply "
                    f"(tools.max_calls_per_turn)")
        if call.name not in self.tools:
            return f"unknown tool {call.name!r}; the tools are: {', '.join(sorted(self.tools))}"
        return check_arguments(self.tools[call.name], call.arguments)

    def counters(self) -> dict[str, float]:
        return {**{k: float(v) for k, v in self.stats.items()}, "seconds": self.seconds}
