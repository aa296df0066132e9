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

Stateful tools (a state per trajectory) are not supported yet: each call is a plain function call.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Any

from rlvr.envs.base import EnvStep
from rlvr.envs.tokens import Message
from rlvr.tools.execute import ToolResult
from rlvr.tools.formats import ParsedCall, parse_calls
from rlvr.tools.registry import Tool, check_arguments

NO_ENVIRONMENT = "tools"
"""The state of a trajectory whose recipe has tools and no environment (a reply without calls ends it)."""


@dataclass(frozen=True)
class ToolSettings:
    """``fmt``: the call format (:data:`rlvr.tools.formats.FORMATS`); ``max_calls_per_turn``: calls run per reply
    (the rest are answered with an error); ``system``: the system text listing the tools when the chat template does
    not (None: the template lists them)."""

    fmt: str
    max_calls_per_turn: int = 4
    system: str | None = None


class ToolRunner:
    """The tool environment (module docstring). ``pool``: runs calls (:class:`~rlvr.tools.execute.ToolPool`, or
    anything with its ``run``); ``inner``: the recipe's environment runner, or None.

    Counters (:meth:`counters`): ``trajectories``, ``calls`` (parsed calls, run or not), ``malformed``, and per tool
    ``<name>/ok``, ``<name>/error``, ``<name>/timeout``, ``<name>/crashed``; ``seconds``: wall time in the pool."""

    def __init__(self, tools: list[Tool], settings: ToolSettings, pool: Any, inner: Any = None) -> None:
        self.tools = {t.name: t for t in tools}
        self.settings, self.pool, self.inner = settings, pool, inner
        self.stats: collections.Counter[str] = collections.Counter()
        self.seconds = 0.0

    def reset(self, rows: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
        """The inner environment's reset (or a tools-only state); the opening is the environment's own or the row's
        (``row["opening"]``), with the tools' system text when the template does not list them."""
        self.stats["trajectories"] += len(rows)
        inner = self.inner.reset(rows) if self.inner is not None else [(NO_ENVIRONMENT, [])] * len(rows)
        out = []
        for row, (state, opening) in zip(rows, inner):
            if state is None:
                out.append((state, opening))
                continue
            msgs = [dict(m) for m in (opening or row.get("opening") or [])]
            if self.settings.system and msgs:
                if msgs[0]["role"] == "system":
                    msgs[0] = {**msgs[0], "content": msgs[0]["content"] + "\n\n" + self.settings.system}
                else:
                    msgs.insert(0, {"role": "system", "content": self.settings.system})
            out.append((state, msgs))
        return out

    def step(self, items: list[tuple[Any, list[Message], Message]]) -> list[tuple[Any, Any]]:
        """One ``(state, EnvStep)`` per item: the calls' results, or the inner environment's step for a reply
        without calls (done without an inner environment)."""
        parsed = [parse_calls(reply["content"], self.settings.fmt) for _, _, reply in items]
        runs: list[tuple[Tool, dict[str, Any]]] = []
        plans: list[list[tuple[ParsedCall, str | int]]] = []  # per item: (call, error text | index into runs)
        for calls in parsed:
            plan = []
            for k, call in enumerate(calls):
                self.stats["calls"] += 1
                why = self._refuse(call, k)
                if why is None:
                    plan.append((call, len(runs)))
                    runs.append((self.tools[call.name], call.arguments))
                else:
                    self.stats["malformed"] += 1
                    plan.append((call, f"error: {why}"))
            plans.append(plan)
        t0 = time.perf_counter()
        results: list[ToolResult] = self.pool.run(runs) if runs else []
        self.seconds += time.perf_counter() - t0
        for r in results:
            self.stats[f"{r.name}/{r.status}"] += 1
        answers: dict[int, tuple[Any, Any]] = {}
        rest = [i for i, plan in enumerate(plans) if not plan]
        if self.inner is not None and rest:
            for i, out in zip(rest, self.inner.step([items[i] for i in rest])):
                answers[i] = out
        out = []
        for i, ((state, _, _), plan) in enumerate(zip(items, plans)):
            if not plan:
                out.append(answers.get(i, (state, EnvStep([], None, True, {"tool_calls": 0}))))
                continue
            msgs, shown = [], []
            for call, ref in plan:
                text = ref if isinstance(ref, str) else results[ref].text
                status = "malformed" if isinstance(ref, str) else results[ref].status
                msgs.append({"role": "tool", "name": call.name or "unknown", "content": text})
                shown.append({"call": call.raw[:200], "status": status, "result": text[:200]})
            out.append((state, EnvStep(msgs, None, False, {"tool_calls": shown})))
        return out

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
