"""Multi-turn rollouts in a training run: the turn loop (:func:`rlvr.envs.turns.run_turns`) on the run's engines and
an :class:`~rlvr.envs.pool.EnvPool`, in a thread of the driver so that a rollout is submitted and collected like a
single-turn one (:func:`rlvr.runtime.rollout_stage.submit_rollout` / ``collect_scored``; the asynchronous loop overlaps
it with the update the same way).
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Any, Callable

from rlvr.config import DataConfig, EnvironmentConfig, ToolsConfig
from rlvr.envs.template_check import list_tools, tool_settings  # noqa: F401 - list_tools: re-exported (tests)
from rlvr.envs.tokens import Message
from rlvr.envs.turns import TurnSettings, run_turns
from rlvr.metrics import names as mn
from rlvr.types import Completion, Prompt, SamplingConfig

Generate = Callable[[list[Prompt], SamplingConfig], list[Completion]]


def env_spec(env: EnvironmentConfig, row: dict[str, Any]) -> dict[str, Any]:
    """The environment a data row starts: ``{"name", "args"}`` from its ``environment.row_field`` if it has one,
    else ``environment.name`` (with ``environment.args``).

    Errors: ``ValueError`` naming the row field and the key when neither gives a name."""
    name = row.get(env.row_field) if env.row_field else None
    if name is None:
        name = env.name
    if name is None:
        raise ValueError(f"a data row has no {env.row_field!r} field and environment.name is not set: set "
                         "environment.name (the default environment) or give every row the field")
    return {"name": str(name), "args": dict(env.args) if name == env.name else {}}


def env_scored(env: EnvironmentConfig, verifiers: tuple[Any, ...]) -> bool:
    """Whether the environment's reward scores a trajectory (``environment.reward`` other than ``verifiers``, or an
    ``environment`` verifier among ``verifiers``, :class:`~rlvr.config.VerifierSpec` s): then the environment also
    steps the reply that ends a trajectory at ``max_turns``, the token limit or another end id, so that the last
    reply kept is the one scored (:class:`rlvr.envs.turns.TurnSettings` ``step_last``)."""
    return env.reward != "verifiers" or any(getattr(v, "name", None) == "environment" for v in verifiers)


class TurnRollouts:
    """The multi-turn rollout of a run (or of ``rlvr eval --environment``): a renderer of the model's chat template,
    the environment pool, and one thread that runs the turn loop of each submitted rollout (one at a time, in
    submission order). ``env``: the recipe's ``environment`` section; ``data``: its ``data`` section (the opening
    of a row without ``messages``); ``max_new_tokens``: the most one turn samples (``rollout.max_new_tokens``);
    ``verifiers``: the recipe's verifier specs (an ``environment`` verifier makes the environment score the last
    reply: :func:`env_scored`).

    Errors: :class:`~rlvr.config.RecipeError` (a ``ValueError``) when the run's chat template is missing or cannot
    carry a trajectory token for token (:func:`rlvr.envs.template_check.checked_renderer`); those of
    :class:`~rlvr.envs.pool.EnvPool`."""

    def __init__(self, env: EnvironmentConfig, data: DataConfig, max_new_tokens: int, model_dir: str,
                 tools: ToolsConfig | None = None, verifiers: tuple[Any, ...] = ()) -> None:
        from transformers import AutoTokenizer

        from rlvr.envs.pool import EnvPool, env_preload
        from rlvr.envs.template_check import checked_renderer

        self.env, self.data, self.tools = env, data, tools if tools is not None and tools.enabled else None
        # the run's template (data.chat_template_path) with the tools listed, probed as --dry-run probes it
        self.renderer, listing = checked_renderer(AutoTokenizer.from_pretrained(model_dir), data, env.enabled,
                                                  self.tools, model_dir)  # fmt: skip
        e = env
        self.settings = TurnSettings(max_turns=e.max_turns, max_tokens=e.max_tokens, max_new_tokens=max_new_tokens,
                                     max_observation_tokens=e.max_observation_tokens,
                                     end_on_length=e.end_on_length, step_last=env_scored(e, verifiers),
                                     max_prompt_tokens=data.max_prompt_tokens)  # fmt: skip
        self.pool: Any = EnvPool(e.num_workers, e.timeout_s, e.memory_mb, preload=env_preload([e.name])) \
            if e.enabled else None
        self.tool_runner = None
        if self.tools is not None and listing is not None:
            self.tool_runner = tool_runner(self.tools, listing, self.pool)
            self.pool = self.tool_runner
        self._thread = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlvr-turns")

    def opening(self, p: Prompt) -> list[Message]:
        """The conversation prompt ``p``'s ids render: the row's own ``messages`` if it has them, else the templated
        question (:func:`rlvr.data.datasets.opening_messages`)."""
        from rlvr.data.datasets import opening_messages, row_messages

        return row_messages(p.row) or opening_messages(p.question, self.data)

    def submit(self, prompts: list[Prompt], sampling: SamplingConfig, generate: Generate) -> cf.Future:
        """Start ``sampling.n`` trajectories from each prompt; the future gives (completions [P x G], prompt-major,
        and the rollout's multi-turn metrics: ``rollout/env_s`` the environments' wall time, ``rollout/engine_idle_frac``
        the share of the turn loop's time the engines waited for environments, ``rollout/obs_tokens_cut``)."""
        openings = [self.opening(p) for p in prompts]
        rows = [{**p.row, "gold": p.gold, "question": p.question, "opening": o,
                 **({"env": env_spec(self.env, p.row)} if self.env.enabled else {})}
                for p, o in zip(prompts, openings)]  # fmt: skip
        return self._thread.submit(self._run, prompts, openings, rows, sampling, generate)

    def _run(self, prompts: list[Prompt], openings: list[list[Message]], rows: list[dict], sampling: SamplingConfig,
             generate: Generate) -> tuple[list[Completion], dict[str, float]]:
        timer = _Timer(self.pool)
        before = self.tool_runner.counters() if self.tool_runner is not None else {}
        t0 = time.perf_counter()
        trajs, counters = run_turns(prompts, openings, sampling.n, generate, timer, self.renderer, self.settings,
                                    sampling, rows)  # fmt: skip
        total = time.perf_counter() - t0
        metrics = {mn.ROLLOUT_ENV_S: timer.seconds, mn.ROLLOUT_ENGINE_IDLE_FRAC: timer.seconds / max(total, 1e-9),
                   mn.ROLLOUT_OBS_TOKENS_CUT: counters["obs_tokens_cut"],
                   mn.ROLLOUT_RENDER_S: counters["render_s"]}  # fmt: skip
        if self.tool_runner is not None:
            metrics.update(tool_metrics(before, self.tool_runner.counters(), total))
        return [t.completion() for t in trajs], metrics

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        if self.tool_runner is not None:
            self.tool_runner.pool.close()
            if self.tool_runner.inner is not None:
                self.tool_runner.inner.close()
        elif self.pool is not None:
            self.pool.close()


def tool_runner(tools: ToolsConfig, listing: Any, inner: Any) -> Any:
    """The recipe's tool environment (:class:`rlvr.tools.runner.ToolRunner`) around ``inner`` (the environment pool,
    or None), for the tools ``listing`` (:func:`rlvr.envs.template_check.list_tools`) lists, on a new tool pool."""
    from rlvr.tools.execute import ToolPool
    from rlvr.tools.runner import ToolRunner

    pool = ToolPool(listing.tools, tools.num_workers, tools.timeout_s, tools.max_output_chars, tools.memory_mb)
    return ToolRunner(listing.tools, tool_settings(tools, listing), pool, inner)


def tool_metrics(before: dict[str, float], after: dict[str, float], total_s: float) -> dict[str, float]:
    """One rollout's tool metrics from the runner's counters before and after it (:mod:`rlvr.metrics.names`):
    calls per trajectory (normaliser: the rollout's trajectories), the malformed share (normaliser: its calls), the
    share of the turn loop's time in tool calls, and each tool's outcomes (counts)."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    calls, trajs = d.get("calls", 0.0), d.get("trajectories", 0.0)
    out = {mn.TOOLS_CALLS_PER_TRAJ: calls / max(trajs, 1.0), mn.TOOLS_MALFORMED_FRAC: d.get("malformed", 0.0) /
           max(calls, 1.0), mn.TOOLS_TIME_FRAC: d.get("seconds", 0.0) / max(total_s, 1e-9)}  # fmt: skip
    for key, v in d.items():
        if "/" in key:
            tool, outcome = key.rsplit("/", 1)
            out[mn.tool_outcome(tool, outcome)] = v
    return out


class _Timer:
    """An environment runner that adds up the wall time of its calls (the engines are idle meanwhile: the turn loop
    runs in rounds, :mod:`rlvr.envs.turns`)."""

    def __init__(self, runner: Any) -> None:
        self.runner, self.seconds = runner, 0.0

    def reset(self, rows: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
        t = time.perf_counter()
        try:
            return self.runner.reset(rows)
        finally:
            self.seconds += time.perf_counter() - t

    def step(self, items: list) -> list[tuple[Any, Any]]:
        t = time.perf_counter()
        try:
            return self.runner.step(items)
        finally:
            self.seconds += time.perf_counter() - t

    def release(self, states: list[Any]) -> None:
        release = getattr(self.runner, "release", None)
        if callable(release):
            t = time.perf_counter()
            try:
                release(states)
            finally:
                self.seconds += time.perf_counter() - t


def last_env_reward(c: Completion) -> float | None:
    """The last reward the environment gave in trajectory ``c`` (``Completion.turn_rewards``), None when it gave
    none."""
    given = [x for x in (c.turn_rewards or []) if x is not None]
    return given[-1] if given else None


def scoring_rows(completions: list[Completion], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` [B] as the verifiers see them for trajectories: each with ``env_reward``, the last reward its
    environment gave (None: none), which the ``environment`` verifier scores (:mod:`rlvr_verifiers.environment`)."""
    return [{**row, "env_reward": last_env_reward(c)} for c, row in zip(completions, rows)]


def trajectory_rewards(completions: list[Completion], scored: list[Any], env: Any) -> list[Any]:
    """``scored`` [B] with each trajectory's reward as ``environment.reward`` says: ``verifiers`` (the recipe's
    verifiers on the final answer: ``Scored.reward`` as scored), ``environment`` (the environment's last reward, 0
    where it gave none), or ``both`` (their sum); then times ``environment.turn_discount ** (turns - 1)``.
    Per-verifier results are kept (pass@k and the correct fraction stay the primary verifier's)."""
    import dataclasses

    out = []
    for c, s in zip(completions, scored):
        env_reward = last_env_reward(c)
        env_reward = 0.0 if env_reward is None else env_reward
        reward = {"verifiers": s.reward, "environment": env_reward, "both": s.reward + env_reward}[env.reward]
        out.append(dataclasses.replace(s, reward=reward * env.turn_discount ** (c.turns - 1)))
    return out
