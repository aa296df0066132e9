"""A ``verifiers`` 0.4.0 environment (PyPI ``verifiers``, import path ``verifiers.v1``) run in rlvr's turn loop:
rlvr samples every assistant turn, the environment only answers and scores (issue 42).

What a "verifiers environment" is in 0.4.0 (mapped from ``verifiers/v1/{taskset,task,env,agent,rollout,session,
trace}.py``, ``envs/single_agent/env.py``, ``tasksets/textarena/taskset.py``, ``mcp/{server,toolset}.py``,
``harnesses/utils/{core,mcp}.py``, ``utils/{loaders,decorators}.py``): a *taskset module* (an installed package or,
here, a local ``.py`` file or folder) exporting via ``__all__`` a ``Taskset`` subclass whose ``load()`` yields typed
``Task`` s (``TaskData``: ``prompt``, ``system_prompt``, ``answer``/``info``...; scoring as ``@vf.reward`` methods
with weights, ``@vf.metric``, ``@vf.stop``, plugged ``TaskConfig.rewards``), optionally an ``Env`` subclass whose
``async run(task, agents)`` drives one agent seat turn by turn (``async with agents.X.interaction(task) as it``,
``await it.turn(message)`` -> ``Segment``; ``trace.record_reward``; ``finalize(task, episode)``) and ``Toolset`` s
(``@vf.tool`` methods served over MCP) from ``Task.toolsets`` / ``Taskset.toolsets``. verifiers loads it with
``load_environment(EnvConfig(taskset={"id": ...}))``; its harness program then calls a model over an
OpenAI-compatible endpoint. Here nothing calls a model: rlvr plays the seat with the ``null`` harness's semantics
(``harnesses/utils/core.py``: the system prompt, the prompt, the model's reply; a reply with tool calls is answered
with tool messages and the segment goes on; a reply without calls ends the segment).

Mapping. ``rows(size, seed, ...)`` (``data.source: env:...``) iterates the taskset (shuffled with ``seed`` when it
is finite); each row carries the task's wire data (``vf_task``, ``vf_task_config``) so a worker rebuilds the task
without loading the taskset's data, ``question`` (the prompt's text), ``answer`` and ``messages`` (the opening).
``reset``/``step`` *replay* ``Env.run`` from the start each call on a stand-in ``Agents`` whose ``turn()`` returns
the recorded segments (rlvr pickles the environment between calls and any worker may take the next one, so no
coroutine is kept alive): at the first turn with no recorded reply the replay stops and the message ``run`` sent is
what rlvr appends. ``run`` must therefore send the same messages for the same replies (checked each replay:
``VerifiersReplayError``). A finished ``run`` is scored as verifiers scores it (``Task.score`` on the trace, then
``Env.finalize``); ``Trace.reward`` (the weighted sum) is mapped onto [0, 1] by ``reward_range`` and returned with
``done``. With ``reward_each_turn`` every other step also returns the score the trajectory would get if it ended
there (the next ``turn()`` comes back ``terminated``, as on a verifiers limit), so a trajectory that rlvr ends at
``max_turns``, the token limit or the budget keeps the environment's verdict. ``max_turns`` is verifiers'
``AgentConfig.max_turns`` (model turns, tool-call turns included; the seat's own cap when lower): set it to
``environment.max_turns``. Tools: the toolsets' ``@vf.tool`` methods are listed in the system message
(:func:`rlvr.tools.formats.describe_tools`, ``tool_format``), called in this process with the trajectory's
``State`` (rebuilt each step: per-rollout state lives in ``self.state``, as verifiers shares it with scoring;
attributes set on the toolset object do not survive a step); a bad call or a raising tool answers ``error: ...``.

Refused, with a :class:`VerifiersRefused` naming the feature: envs with more than one agent seat (``user-sim``,
``best-of-n``, judges as agents), harness programs other than ``null`` (``bash``, ``codex``, ``claude_code``...),
container/sandbox tasks (``NEEDS_CONTAINER``, ``image``, ``setup``/``finalize``/``stage_verifier`` hooks, scoring
that needs a ``runtime``), plugged LLM judges (``TaskConfig.judges``: an API endpoint and key), ``@vf.intercept`` and
``Request``/``Response`` ``@stop`` hooks (they act on wire requests), remote or containerized toolsets, a second
rollout in one episode, ``Interaction.send``/``steer`` and non-text message content. An error raised by the
environment (``run``, a reward, ``finalize``) propagates: the trajectory ends as an environment failure.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import importlib.util
import inspect
import json
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from rlvr.envs.base import EnvStep
from rlvr.envs.tokens import Message

_MULTI_AGENT_ENVS = {"user_sim", "best_of_n", "agentic_judge", "shared_agentic_judge", "isolated_verifier"}


class VerifiersRefused(ValueError):
    """A verifiers feature this adapter does not map (the message names it and what is supported instead)."""


class VerifiersReplayError(RuntimeError):
    """``Env.run`` sent a different message on a replay than before for the same replies (not deterministic)."""


def refuse(feature: str, why: str) -> VerifiersRefused:
    return VerifiersRefused(f"verifiers adapter: {feature} is not supported ({why}). Supported: a taskset with a "
                            "prompt, @vf.reward/@vf.metric/Trace @vf.stop scoring, an Env with one agent seat "
                            "driving interaction().turn() or run(), and in-process @vf.tool toolsets "
                            "(docs/environments.md, verifiers)")


def import_vf() -> Any:
    """``verifiers.v1`` of the installed distribution, also where rlvr's own ``verifiers/`` folder (installed as
    ``rlvr_verifiers``) shadows the name from the current directory. Errors: ``ImportError`` when not installed."""
    try:
        return importlib.import_module("verifiers.v1")
    except ModuleNotFoundError:
        pass
    try:
        root = Path(importlib.metadata.distribution("verifiers").locate_file("verifiers"))
    except importlib.metadata.PackageNotFoundError:
        raise ImportError("the verifiers adapter needs the verifiers package: pip install verifiers==0.4.0") from None
    for name in [m for m in sys.modules if m == "verifiers" or m.startswith("verifiers.")]:
        del sys.modules[name]  # the shadowing folder's module; the distribution's replaces it
    spec = importlib.util.spec_from_file_location("verifiers", root / "__init__.py",
                                                  submodule_search_locations=[str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["verifiers"] = module
    spec.loader.exec_module(module)
    return importlib.import_module("verifiers.v1")


def taskset_id(taskset: str) -> str:
    """The module name verifiers imports for ``taskset``: an installed module name as is, or a local ``.py`` file
    or package folder (its parent folder goes on ``sys.path``). Errors: ``FileNotFoundError`` for a missing path."""
    if not (taskset.endswith(".py") or "/" in taskset):
        return taskset
    path = Path(taskset).expanduser().resolve()
    if not path.exists():
        raise FileNotFoundError(f"verifiers adapter: taskset {taskset!r} not found (resolved to {path})")
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    return path.stem if path.suffix == ".py" else path.name


_LOADED: dict[str, dict[str, Any]] = {}  # per process, by the environment's arguments: never pickled


def load(taskset: str, taskset_args: dict | None, env: str | None, env_args: dict | None) -> dict[str, Any]:
    """The loaded environment for these arguments (cached per process): ``vf``, ``env`` (the ``Env``), ``seat``
    (name, ``AgentConfig``), ``taskset``. Errors: :class:`VerifiersRefused` for what cannot map; verifiers' own."""
    key = json.dumps([taskset, taskset_args, env, env_args], sort_keys=True, default=str)
    if key in _LOADED:
        return _LOADED[key]
    vf = import_vf()
    from verifiers.v1.utils import loaders

    tid = taskset_id(taskset)
    if env and env.replace("-", "_") in _MULTI_AGENT_ENVS:
        raise refuse(f"the built-in env {env!r}", "it plays several agents; rlvr trains one conversation")
    module = loaders.import_taskset(tid)
    try:
        loaders._plugin_class(module, vf.Harness, "harness")
        raise refuse(f"taskset {tid!r}'s own harness", "a harness program calls the model itself; rlvr samples")
    except (TypeError, AttributeError):
        pass
    config = loaders.env_config_type(tid, env or "").model_validate(json.loads(json.dumps(  # verifiers edits dicts
        {**(env_args or {}), "id": env or "", "taskset": {**(taskset_args or {}), "id": tid}})))
    seats = {name: cfg for name, cfg in config if isinstance(cfg, vf.AgentConfig)}
    if len(seats) != 1:
        raise refuse(f"an env with the agent seats {sorted(seats)}", "rlvr plays exactly one seat")
    (name, seat), = seats.items()
    if seat.harness is not None and seat.harness.id != "null":
        raise refuse(f"the harness {seat.harness.id!r}", "harness programs run the model themselves; rlvr plays "
                     "the null harness (leave the seat's harness unset or null)")
    envobj = loaders.load_environment(config)
    _LOADED[key] = {"vf": vf, "env": envobj, "seat": (name, seat), "taskset": envobj.taskset}
    return _LOADED[key]


def check_task(vf: Any, task: Any) -> None:
    """Refuse a task whose behaviour needs what rlvr does not run (a sandbox, a judge model, wire hooks)."""
    from verifiers.v1.session import hook_boundary
    from verifiers.v1.utils.decorators import discover_decorated

    cls = type(task)
    if cls.NEEDS_CONTAINER or task.data.image:
        raise refuse(f"the container task {cls.__name__}", "it runs in a sandbox image")
    for hook in ("setup", "finalize", "stage_verifier"):
        if getattr(cls, hook) is not getattr(vf.Task, hook):
            raise refuse(f"{cls.__name__}.{hook}()", "task hooks act on a runtime box, which rlvr does not provide")
    if task.config.judges:
        raise refuse("plugged judges (TaskConfig.judges)", "verifiers judges call an LLM endpoint with an API key; "
                     "score with a @vf.reward function or an rlvr verifier")
    if discover_decorated(task, "intercept"):
        raise refuse(f"{cls.__name__}'s @vf.intercept hooks", "they rewrite wire requests, and rlvr sends none")
    for fn in task.hooks("stop"):
        if hook_boundary(fn, allow_trace=True) is not vf.Trace:
            raise refuse(f"the Request/Response @vf.stop {fn.__name__}", "it acts on wire requests")
    for fn in (*task.hooks("reward"), *task.hooks("metric")):
        param = inspect.signature(fn).parameters.get("runtime")
        if param is not None and param.default is inspect.Parameter.empty:
            raise refuse(f"the scoring function {fn.__name__}(runtime)", "it needs a sandbox runtime")


def tool_table(vf: Any, toolsets: list[Any]) -> dict[str, tuple[Any, str, Any]]:
    """``{called name: (toolset, method name, pydantic model of its arguments)}`` for the toolsets' ``@vf.tool``
    methods, named as verifiers' MCP client names them (``<server>_<tool>``)."""
    import pydantic
    from verifiers.v1.runtimes import SubprocessConfig
    from verifiers.v1.utils.decorators import discover_decorated

    table = {}
    for ts in toolsets:
        cfg = ts.config
        if getattr(cfg, "url", None) or not isinstance(getattr(cfg, "runtime", SubprocessConfig()), SubprocessConfig):
            raise refuse(f"the toolset {type(ts).__name__} on a remote server or container runtime",
                         "rlvr calls @vf.tool methods in the environment worker")
        for fn in discover_decorated(ts, "tool"):
            tool = getattr(fn, "tool_name", None) or fn.__name__
            full = f"{ts.server_name}_{tool}" if ts.server_name else tool
            fields = {p.name: (p.annotation if p.annotation is not p.empty else Any,
                               ... if p.default is p.empty else p.default)
                      for p in inspect.signature(fn).parameters.values()}
            model = pydantic.create_model(f"{full}_args", **fields)
            model.__doc__ = (fn.__doc__ or "").strip()
            table[full] = (ts, fn.__name__, model)
    return table


def listing(table: dict[str, tuple[Any, str, Any]], fmt: str) -> str | None:
    """The system text listing the tools' JSON schemas and how to call them in ``fmt`` (None without tools)."""
    from rlvr.tools.formats import describe_tools

    schemas = [{"type": "function", "function": {"name": name, "description": model.__doc__ or "", "parameters": {
        k: v for k, v in model.model_json_schema().items() if k not in ("title", "description")}}}
        for name, (_, _, model) in table.items()]
    return describe_tools(schemas, fmt) if schemas else None


class _Suspend(BaseException):
    """The replay reached a turn with no recorded reply (a BaseException: ``except Exception`` in a run() keeps
    out of it)."""


def rlvr_msg(m: dict[str, Any]) -> Message:
    content = m.get("content")
    if not isinstance(content, str):
        raise refuse("non-text message content", f"got {str(content)[:80]!r}; rlvr messages carry text")
    return {"role": m["role"], "content": content}


class _Play:
    """One replay of ``Env.run`` over the recorded segments (see the module docstring)."""

    def __init__(self, adapter: VerifiersEnv, loaded: dict[str, Any], task: Any, terminate: bool) -> None:
        from pydantic import TypeAdapter

        self.a, self.L, self.vf, self.row_task, self.terminate = adapter, loaded, loaded["vf"], task, terminate
        self.msg = TypeAdapter(self.vf.Message)
        self.trace = None
        self.task = None
        self.k = 0
        self.new: list[dict[str, Any]] | None = None  # the messages sent at the frontier
        self.pending_stop: str | None = None  # a stop or cap that fired inside the segment under way

    def node(self, m: dict[str, Any], sampled: bool) -> None:
        from verifiers.v1.graph import MessageNode

        self.trace.nodes.append(MessageNode(parent=len(self.trace.nodes) - 1 if self.trace.nodes else None,
                                            message=self.msg.validate_python(m), sampled=sampled))

    def open(self, task: Any) -> None:
        from verifiers.v1.state import state_cls
        from verifiers.v1.trace import AgentInfo, TraceTask

        if self.trace is not None:
            raise refuse("a second rollout in one episode", "rlvr's trajectory is one conversation")
        check_task(self.vf, task)
        self.task = task
        state = state_cls(type(task)).model_validate_json(self.a.state_json) if self.a.state_json \
            else state_cls(type(task))()
        self.trace = self.vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key,
                                                  hash=task.hash), state=state,
                                   agent=AgentInfo(config=self.L["seat"][1], name=self.L["seat"][0]))

    def system(self) -> list[dict[str, Any]]:
        tools = listing(self.a.tools(self.task), self.a.tool_format)
        text = "\n\n".join(s for s in (self.task.data.system_prompt, tools) if s)
        return [{"role": "system", "content": text}] if text else []

    async def stopped(self) -> str | None:
        """verifiers' check before a model call (``RolloutSession``): the turn cap, then Trace ``@stop`` s."""
        cap = self.a.turn_cap(self.L["seat"][1])
        if cap is not None and self.trace.num_turns >= cap:
            return "max_turns"
        for fn in self.task.hooks("stop"):
            result = fn(self.trace)
            if await result if inspect.isawaitable(result) else result:
                return fn.__name__
        return None

    async def turn(self, message: Any = None) -> Any:
        """``Interaction.turn``: a recorded segment, or at the first unrecorded one, suspend (or end the exchange
        when replaying to score)."""
        from verifiers.v1.agent import Segment

        prompt = self.task.data.prompt
        prompted = self.k == 0 and prompt is not None
        if message is None and not prompted:
            raise ValueError("nothing to run a turn on: a bare turn() takes a prompted task's opening reply")
        if message is not None and prompted:
            raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
        if prompted:
            message = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        sent = [{"role": "user", "content": message}] if isinstance(message, str) else \
            [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in message]
        sent = (self.system() if self.k == 0 else []) + sent
        segs = self.a.segments + ([self.a.pending] if self.terminate and self.a.pending else [])
        turns = self.a.turns
        if self.k < len(turns) and turns[self.k] != sent:
            raise VerifiersReplayError(f"Env.run sent {str(sent)[:200]!r} at turn {self.k} on replay, "
                                       f"{str(turns[self.k])[:200]!r} before: run() must answer the same replies "
                                       "the same way (rlvr replays it each step)")
        for m in sent:
            self.node(m, False)
        if self.k < len(segs):
            seg = segs[self.k]
            for m in seg:
                self.node(m, m["role"] == "assistant")
            self.k += 1
            if seg is self.a.pending:  # verifiers checks before the segment's next model call
                self.pending_stop = await self.stopped()
            return Segment(messages=[n.message for n in self.trace.nodes[len(self.trace.nodes) - len(seg):]])
        stop = await self.stopped()
        if stop or self.terminate:
            self.trace.stop(stop or "rlvr_ended")
            return Segment(messages=[], terminated=True)
        self.new = sent
        raise _Suspend

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        raise refuse("Interaction.send/steer", "rlvr answers only at turn boundaries: use turn(message)")

    steer = send

    async def close(self) -> None:
        if not self.trace.stop_condition:
            self.trace.stop("user_closed")
        await self.task.score(self.trace, None)
        self.trace.is_completed = self.trace.ok = True

    async def play(self) -> Any:
        from verifiers.v1.agent import Agents
        from verifiers.v1.episode import EnvInfo, Episode
        from verifiers.v1.trace import TraceTask

        play = self

        class Seat:
            trainable = True

            @asynccontextmanager
            async def interaction(self, task: Any, **_: Any) -> Any:
                play.open(task)
                yield play
                await play.close()

            async def run(self, task: Any, **_: Any) -> Any:
                play.open(task)
                if task.data.prompt is None:
                    raise refuse("agent.run() on a task without a prompt", "the harness would have nothing to "
                                 "answer; open it with interaction().turn(message)")
                await play.turn()
                play.trace.stop("agent_completed")  # as Agent.run stamps a finished segment
                await play.close()
                return play.trace

        env = self.L["env"]
        agents = Agents(env.config, lambda name, cfg: Seat())
        await env.setup(agents)
        await env.run(self.row_task, agents)
        if self.trace is None:
            raise ValueError(f"{type(env).__name__}.run() ran no agent")
        t = self.row_task
        episode = Episode(env=EnvInfo(id=env.config.env_id), task=TraceTask(type=type(t).__name__, data=t.data),
                          traces=[self.trace])
        await env.finalize(t, episode)
        return self.trace


class VerifiersEnv:
    """A verifiers 0.4.0 environment as an rlvr environment (the module docstring).

    Args: ``taskset``: the taskset module (installed name, or a local ``.py`` file or package folder);
    ``taskset_args``: its ``TasksetConfig`` fields; ``env``/``env_args``: an ``Env`` id and its ``EnvConfig`` fields
    (default: the taskset module's own ``Env``, else ``SingleAgentEnv``); ``max_turns``: verifiers' turn cap (set it
    to ``environment.max_turns``); ``reward_range``: ``[low, high]`` of ``Trace.reward`` (the weighted sum), mapped
    linearly onto [0, 1] (a reward outside it raises); ``tool_format``: how tool calls are written (``hermes``,
    ``llama3``, ``mistral``); ``reward_each_turn``: score every step as if the trajectory ended there; ``shuffle``:
    ``rows`` shuffles a finite taskset with the seed."""

    preload_modules = ("rlvr.envs.verifiers_preload",)
    """Imported by each environment worker as it starts (:class:`rlvr.envs.pool.EnvPool`): ``import verifiers``
    takes 3-5 s on 2 busy cores, more than a call's limit should absorb."""

    def __init__(self, taskset: str, taskset_args: dict | None = None, env: str | None = None,
                 env_args: dict | None = None, max_turns: int | None = None,
                 reward_range: tuple[float, float] | list[float] = (0.0, 1.0), tool_format: str = "hermes",
                 reward_each_turn: bool = True, shuffle: bool = True) -> None:
        self.check_args(taskset=taskset, max_turns=max_turns, reward_range=reward_range, tool_format=tool_format,
                        load=False)
        self.spec = (taskset, taskset_args or {}, env, env_args or {})
        self.max_turns, self.range = max_turns, (float(reward_range[0]), float(reward_range[1]))
        self.tool_format, self.reward_each_turn, self.shuffle = tool_format, reward_each_turn, shuffle
        self.task_json: dict[str, Any] | None = None
        self.turns: list[list[dict[str, Any]]] = []  # what run() sent at each turn (the opening first)
        self.segments: list[list[dict[str, Any]]] = []  # each finished segment's assistant and tool messages
        self.pending: list[dict[str, Any]] = []  # the segment under way (tool calls answered)
        self.state_json = ""

    @staticmethod
    def check_args(**args: Any) -> None:
        """Load-time checks of ``environment.args`` (ValueError/TypeError naming the argument and the fix); with
        ``load`` (rlvr's preflight), the environment is loaded and its first task checked (:class:`VerifiersRefused`
        for a feature this adapter does not map, before any worker starts)."""
        from rlvr.tools.formats import FORMATS

        if not isinstance(args.get("taskset"), str) or not args["taskset"]:
            raise ValueError("environment.args.taskset: give the verifiers taskset module (a name or a .py path)")
        lo_hi = args.get("reward_range", (0.0, 1.0))
        if not (isinstance(lo_hi, (list, tuple)) and len(lo_hi) == 2 and float(lo_hi[0]) < float(lo_hi[1])):
            raise ValueError(f"environment.args.reward_range={lo_hi!r}: give [low, high] with low < high")
        if args.get("tool_format", "hermes") not in FORMATS:
            raise ValueError(f"environment.args.tool_format={args.get('tool_format')!r}: one of {', '.join(FORMATS)}")
        mt = args.get("max_turns")
        if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
            raise ValueError(f"environment.args.max_turns={mt!r}: a positive integer (environment.max_turns)")
        if args.get("load", True):
            loaded = load(args["taskset"], args.get("taskset_args"), args.get("env"), args.get("env_args"))
            for task in loaded["taskset"].take(1):
                check_task(loaded["vf"], task)

    @classmethod
    def rows(cls, size: int, seed: int, **args: Any) -> list[dict]:
        """``size`` rows of the taskset (``data.source: env:...``; ``args``: this class's, ``data.env_rows.args``):
        ``question`` (the prompt's text, else the opening's last message), ``answer`` (``TaskData.answer`` when it
        has one, else ""), ``messages`` (the opening), ``vf_task``/``vf_task_config`` (the task's wire data and
        config, JSON). A finite taskset is shuffled with ``seed`` first (``shuffle``). Errors: ``ValueError`` when
        the taskset has fewer than ``size`` tasks; ``TypeError`` for an argument this class does not take."""
        me = cls(**args)
        view = me._loaded()["taskset"]
        view = view.shuffle(seed) if me.shuffle and view.bounded else view
        tasks = list(view.take(size))
        if len(tasks) < size:
            raise ValueError(f"verifiers taskset {me.spec[0]!r} has {len(tasks)} tasks; data.env_rows.size asks {size}")
        out = []
        for task in tasks:
            row = {"vf_task": task.data.model_dump(mode="json", exclude_defaults=True),
                   "vf_task_config": task.config.model_dump(mode="json"), "vf_made_by": me.made_by()}
            opening = cls(**args).reset(row)
            answer = getattr(task.data, "answer", None)
            out.append({"question": task.data.prompt_text or opening[-1]["content"],
                        "answer": "" if answer is None else str(answer), "messages": opening, **row})
        return out

    def _loaded(self) -> dict[str, Any]:
        return load(*self.spec)

    def made_by(self) -> str:
        """The taskset (file name or module), its args and the env id: what rows depend on, as JSON (rows carry it)."""
        return json.dumps([Path(self.spec[0]).name, self.spec[1], self.spec[2]], sort_keys=True)

    def _task(self) -> Any:
        cls = type(self._loaded()["taskset"]).task_type()
        return cls(cls.data_type().model_validate(self.task_json["vf_task"]),
                   cls.config_type().model_validate(self.task_json["vf_task_config"]))

    def turn_cap(self, seat: Any) -> int | None:
        caps = [c for c in (self.max_turns, seat.max_turns) if c is not None]
        return min(caps) if caps else None

    def tools(self, task: Any) -> dict[str, tuple[Any, str, Any]]:
        """The task's and the taskset's toolsets, freshly built (:func:`tool_table`)."""
        L = self._loaded()
        ts = L["taskset"]
        return tool_table(L["vf"], [*type(task).toolsets(task.config), *type(ts).toolsets(ts.config)])

    def _play(self, terminate: bool) -> _Play:
        play = _Play(self, self._loaded(), self._task(), terminate)
        try:
            asyncio.run(play.play())
        except _Suspend:  # at turn k == len(self.turns): each turn suspends once, on the step that reaches it
            self.turns.append(play.new)
        return play

    def _verdict(self, play: _Play) -> tuple[float, dict[str, Any]]:
        """``Trace.reward`` on [0, 1] (``reward_range``) and the info shown. Errors: an unscored reward, a reward
        outside the range."""
        t, (lo, hi) = play.trace, self.range
        if missing := [k for k, r in t.rewards.items() if r is None]:
            raise RuntimeError(f"verifiers scoring left the rewards {missing} unscored")
        value = (t.reward - lo) / (hi - lo)
        if not -1e-9 <= value <= 1 + 1e-9:
            raise ValueError(f"verifiers reward {t.reward:g} (weighted sum of {dict(t.rewards)}) lies outside "
                             f"reward_range [{lo:g}, {hi:g}]: set environment.args.reward_range")
        return min(1.0, max(0.0, value)), {"vf_rewards": {k: r.score for k, r in t.rewards.items()},
                                           "vf_metrics": dict(t.metrics), "vf_stop": t.stop_condition}

    def reset(self, row: dict[str, Any]) -> list[Message]:
        """The opening (system prompt with the tool listing, the task's prompt or run()'s first message).
        Errors: ``KeyError`` for a row without ``vf_task`` (rows come from :meth:`rows`); the environment's own."""
        if "vf_task" not in row or "vf_task_config" not in row:
            raise KeyError("verifiers adapter: the row has no vf_task/vf_task_config; take rows from "
                           "data.source: env:<this environment> (VerifiersEnv.rows) or a file rows() wrote")
        if row.get("vf_made_by", self.made_by()) != self.made_by():
            raise ValueError(f"verifiers adapter: the row was made by {row['vf_made_by']} and this environment is "
                             f"{self.made_by()}: give data.env_rows.args the environment's args (a YAML anchor)")
        self.task_json = {"vf_task": row["vf_task"], "vf_task_config": row["vf_task_config"]}
        play = self._play(terminate=False)
        if play.new is None:
            raise ValueError("verifiers adapter: run() finished without asking the model anything")
        return [rlvr_msg(m) for m in play.new]

    def _call(self, task: Any, table: dict[str, tuple[Any, str, Any]], call: Any) -> str:
        """One tool call's result text: the ``@vf.tool`` method run with the trajectory's ``State`` (its setup
        hooks first); a malformed call, unknown tool, bad arguments or a raising tool give ``error: ...``."""
        from verifiers.v1.mcp.server import _call_state
        from verifiers.v1.state import state_cls

        if call.error or call.name not in table:
            return f"error: {call.error or f'unknown tool {call.name!r}; the tools: ' + ', '.join(table)}"
        ts, method, model = table[call.name]
        state = state_cls(type(ts)).model_validate_json(self.state_json or "{}")
        token = _call_state.set(state)
        try:
            args = dict(model.model_validate(call.arguments if isinstance(call.arguments, dict) else {}))
            result = asyncio.run(_call_tool(ts, task, method, args))
            self.state_json = state.model_dump_json()
            return result if isinstance(result, str) else json.dumps(result, default=str)
        except Exception as e:  # noqa: BLE001 - a failing tool is the model's observation, as over MCP
            return f"error: {type(e).__name__}: {e}"
        finally:
            _call_state.reset(token)

    def step(self, history: list[Message], reply: Message) -> EnvStep:
        """Answer one reply (module docstring): tool results (the segment goes on), run()'s next message, or the
        verdict with ``done``. Errors: the environment's own; :class:`VerifiersReplayError`."""
        from rlvr.tools.formats import parse_calls

        text, task = reply.get("content") or "", self._task()
        table = self.tools(task)
        calls = parse_calls(text, self.tool_format) if table else []
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            ids = [c.id or f"call_{len(self.segments)}_{len(self.pending)}_{i}" for i, c in enumerate(calls)]
            msg["content"] = functools.reduce(lambda t, c: t.replace(c.raw, ""), calls, text).strip()
            msg["tool_calls"] = [{"id": i, "name": c.name or "?", "arguments": c.raw if c.error else
                                  json.dumps(c.arguments)} for i, c in zip(ids, calls)]
        self.pending.append(msg)
        if calls:
            results = [{"role": "tool", "tool_call_id": i, "name": c.name or "?", "content": self._call(task, table, c)}
                       for i, c in zip(ids, calls)]
            self.pending += results
            probe = self._play(True)  # the score if it ended here; a stop/cap that fires ends the segment
            if probe.pending_stop is None:
                reward, info = self._verdict(probe) if self.reward_each_turn else (None, {})
                return EnvStep([rlvr_msg(m) | {"tool_call_id": m["tool_call_id"], "name": m["name"]}
                                for m in results], reward, False, info)
        self.segments.append(self.pending)
        self.pending = []
        play = self._play(terminate=False)
        if play.new is None:
            reward, info = self._verdict(play)
            return EnvStep([], reward, True, info)
        reward, info = self._verdict(self._play(True)) if self.reward_each_turn else (None, {})
        return EnvStep([rlvr_msg(m) for m in play.new], reward, False, info)


async def _call_tool(ts: Any, task: Any, method: str, args: dict[str, Any]) -> Any:
    await ts.setup()
    await ts.setup_task(task)
    result = getattr(ts, method)(**args)
    return await result if inspect.isawaitable(result) else result
