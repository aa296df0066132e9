"""The turn loop: G trajectories per start, the engines sample each assistant turn, the environments answer.

Token-in/token-out (:mod:`rlvr.envs.tokens`): a trajectory's ids are its prompt ids, then each turn's sampled ids
(loss mask 1, the sampler's logprobs) followed by the ids between turns (loss mask 0, logprob 0). Nothing sampled is
re-tokenised. Where the template breaks the prefix property (it rewrites earlier turns), the trajectory ends there
(``prefix_broken``, counted): what was sampled is trained as sampled, never on ids the template would render
otherwise. Templates known to rewrite history are refused at load (:func:`rlvr.envs.tokens.check_template`).

Scheduling: turns are batched in rounds. Each round sends every live trajectory's next turn to the engine in one
call (the engine batches them), then steps every environment at once on the environment runner (worker
processes: :class:`rlvr.envs.pool.EnvPool`), so the engines wait for the slowest environment step of a round and no
longer; a trajectory that ends leaves the next round smaller.

A trajectory ends when the environment says ``done``, at ``max_turns`` assistant turns, when a turn is cut at the
token limit (``length``), when the next turn would not fit the trajectory's token budget (``budget``), or when its
environment fails (``env: <reason>``: a timeout, a crash, bad output), or when the template breaks the prefix
property (``prefix_broken``); the batch goes on either way. A runner with a ``release`` method (the tool
environment's stateful tools) is given each trajectory's state once, in the round it ends, and every trajectory
not yet released when the loop stops, raising or not.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from rlvr.envs.base import EnvStep
from rlvr.envs.tokens import ChatRenderer, Message
from rlvr.seeding import turn_seed
from rlvr.types import Completion, Prompt, SamplingConfig


@dataclass(frozen=True, kw_only=True)
class TurnSettings:
    """How long a trajectory may run.

    ``max_turns``: assistant turns at most; ``max_tokens``: the trajectory's budget of tokens after its first
    prompt (sampled, environment and template tokens together); ``max_observation_tokens``: a cap on each
    environment message's content tokens (the end is cut and replaced by a marker naming how many were cut;
    0: no cap); ``max_new_tokens``: the most one turn may sample.
    """

    max_turns: int
    max_tokens: int
    max_new_tokens: int
    max_observation_tokens: int = 0
    end_on_length: bool = True
    """A turn cut at ``max_new_tokens`` ends the trajectory (``length``); False: the template closes the turn and
    the environment answers it (benchmarks that fix each turn's length)."""
    step_last: bool = False
    """The environment also answers the reply that ends a trajectory at ``max_turns``, at the token limit or on an
    end id other than the template's (``stop_id``): its reward and info are kept, its messages dropped (nobody
    answers them). True where the environment's reward is used (``environment.reward: environment`` or ``both``),
    so that the last reply a trajectory keeps is the one scored."""
    max_prompt_tokens: int = 0
    """The most tokens an environment's own opening (from ``reset``) may render to (``data.max_prompt_tokens``, the
    limit every row's prompt is held to); over it the trajectory ends as an environment failure. 0: no limit."""


@dataclass
class Segment:
    """A trajectory's training sequence: ``prompt_ids`` [L], then ``ids`` [T] with ``mask`` [T] (1 sampled),
    ``logprobs`` [T] (nats; 0 where mask is 0) and ``versions`` [T] (the policy version that sampled each token;
    -1 where mask is 0)."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def add(self, ids: Sequence[int], logprobs: Sequence[float] | None, versions: Sequence[int] | None = None) -> None:
        """Append ``ids``: sampled (with their ``logprobs`` and ``versions``, one per id) or, with ``logprobs``
        None, put there by the environment or the template."""
        self.ids += list(ids)
        self.mask += [1 if logprobs is not None else 0] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.versions += list(versions) if logprobs is not None and versions is not None else [-1] * len(ids)


@dataclass
class Trajectory:
    """One trajectory: its start, its conversation, its token sequence (``seq``) and how it ended.

    ``turn_rewards``: the environment's reward per assistant turn (None where it gave none); ``versions``: the
    policy version of each turn's sampler; ``end``: why it ended (see the module docstring); ``broken``: how many
    turns broke the template's prefix property; ``opening``: how many of ``messages`` are the opening.
    """

    start: Prompt
    sample_index: int
    messages: list[Message]
    seq: Segment
    state: Any = None
    turns: int = 0
    turn_rewards: list[float | None] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    end: str | None = None
    last_text: str = ""
    last_finish: str = "stop"
    broken: int = 0
    info: list[dict] = field(default_factory=list)
    released: bool = False
    """Its state was handed to the runner's ``release`` (once, when it ended)."""
    opening: int = 0
    failure: str | None = None
    """The runner's whole text for the infrastructure failure that ended it (first line: the reason; a traceback
    may follow); None: none."""

    @property
    def used(self) -> int:
        """The budget's count: the tokens after the prompt."""
        return len(self.seq.ids)

    def completion(self) -> Completion:
        """The trajectory as one :class:`Completion`: ``token_ids`` every id after the prompt, ``loss_mask`` 1 on
        the sampled ones, ``text`` the last assistant message (what verifiers judge), ``policy_version`` the oldest
        turn's, ``token_versions`` each token's (:class:`Segment`)."""
        s = self.seq
        return Completion(
            prompt_index=self.start.index, sample_index=self.sample_index, prompt_ids=list(s.prompt_ids),
            token_ids=list(s.ids), logprobs=list(s.logprobs), text=self.last_text, finish_reason=self.last_finish,
            policy_version=min(self.versions) if self.versions else 0, loss_mask=list(s.mask), turns=self.turns,
            messages=[dict(m) for m in self.messages], turn_rewards=list(self.turn_rewards), end_reason=self.end,
            opening_messages=self.opening, turn_info=[dict(i) for i in self.info], failure=self.failure,
            token_versions=list(s.versions),
        )  # fmt: skip


class EnvRunner(Protocol):
    """Runs environments somewhere (worker processes, or in-process for tests). Each call takes a batch and returns
    one outcome per item, in order: ``(state, value)`` or ``(None, "reason")`` for a failure.

    Optional: ``release(states: list) -> None``, called by :func:`run_turns` with the last state of trajectories
    that ended (each trajectory once, whatever ended it: ``done``, ``max_turns``, ``length``, ``budget``, an
    environment failure, ``prefix_broken``, or the turn loop raising), to free what they hold (stateful tools:
    :meth:`rlvr.tools.runner.ToolRunner.release`). It should not raise. Runners without it hold nothing to free."""

    def reset(self, rows: list[dict[str, Any]]) -> list[tuple[Any, Any]]: ...

    def step(self, items: list[tuple[Any, list[Message], Message]]) -> list[tuple[Any, Any]]: ...


Generate = Callable[[list[Prompt], SamplingConfig], list[Completion]]


def cap_observation(messages: list[Message], renderer: ChatRenderer, cap: int) -> tuple[list[Message], int]:
    """Each message's content cut to its first ``cap`` tokens (the end cut, replaced by ``"... [N tokens cut]"``);
    returns the messages and the tokens cut in all. ``cap`` 0: unchanged.

    A content longer than ``cap`` tokens can be in characters (``cap * renderer.max_token_chars``: no token is
    longer) is cut to that many characters before it is tokenised, so a flood (a 1 MB observation) costs the
    tokenisation of its head only; the tokens cut are then estimated from the head's characters per token and the
    marker says ``about``."""
    if cap <= 0:
        return messages, 0
    out, cut = [], 0
    for m in messages:
        text, head_chars = m["content"], cap * renderer.max_token_chars
        head = text if len(text) <= head_chars else text[:head_chars]
        ids = renderer.encode(head)
        if head is text and len(ids) > cap:
            n, about = len(ids) - cap, ""
        elif head is not text:  # at least cap tokens in the head; the rest estimated at the head's rate
            n, about = len(ids) - cap + round((len(text) - len(head)) * len(ids) / max(len(head), 1)), "about "
        else:
            out.append(m)
            continue
        cut += n
        out.append({**m, "content": renderer.tokenizer.decode(ids[:cap]) + f"... [{about}{n} tokens cut]"})
    return out, cut


LAST_REPLY_ENDS = ("max_turns", "length", "stop_id")
"""Ends at which the trajectory keeps a reply nobody answered: with ``TurnSettings.step_last`` the environment
still scores it."""


def run_turns(starts: list[Prompt], openings: list[list[Message]], g: int, generate: Generate, runner: EnvRunner,
              renderer: ChatRenderer, settings: TurnSettings, sampling: SamplingConfig,
              env_rows: list[dict[str, Any]]) -> tuple[list[Trajectory], dict[str, float]]:
    """``g`` trajectories from each start (prompt-major, as an engine orders samples): reset every environment,
    then rounds of (one engine call for every live trajectory's turn, one runner call for every environment step)
    until all have ended. ``openings[i]``: start i's opening conversation (the messages its prompt ids render);
    ``env_rows[i]``: the row its environments start from; an environment whose ``reset`` returns messages starts
    from those instead (rendered with the generation prompt; over ``settings.max_prompt_tokens``, or not rendered by
    the template, the trajectory ends as an environment failure). ``sampling.seed`` seeds round r
    (:func:`rlvr.seeding.turn_seed`).

    Returns (trajectories [P x G], counters: ``turns``, ``env_failures``, ``prefix_breaks``, ``obs_tokens_cut``,
    ``render_s``: seconds spent rendering and tokenising the environments' messages in this thread).
    """
    trajs: list[Trajectory] = []
    for i, p in enumerate(starts):
        for j in range(g):
            trajs.append(Trajectory(start=p, sample_index=j, messages=[dict(m) for m in openings[i]],
                                    seq=Segment(prompt_ids=list(p.prompt_ids))))  # fmt: skip
    counters = {"turns": 0.0, "env_failures": 0.0, "prefix_breaks": 0.0, "obs_tokens_cut": 0.0, "render_s": 0.0}
    try:
        for t, (state, opening) in zip(trajs, runner.reset([env_rows[i] for i in range(len(starts))
                                                            for _ in range(g)])):  # fmt: skip
            t.state = state
            if state is None:
                _fail(t, opening, counters)
            elif opening:  # the environment's own opening replaces the row's
                _open(t, opening, renderer, settings, counters)
            t.opening = len(t.messages)
        round_ = 0
        while True:
            live = [t for t in trajs if t.end is None]
            if not live:
                break
            _sample_round(live, generate, settings, sampling, round_, renderer.eos_id)
            counters["turns"] += len(live)
            asking = [t for t in live if t.end is None or (settings.step_last and t.end in LAST_REPLY_ENDS)]
            outcomes = runner.step([(t.state, t.messages[:-1], t.messages[-1]) for t in asking]) if asking else []
            for t, (state, step) in zip(asking, outcomes):
                _answer(t, state, step, renderer, settings, counters)
            _release(runner, [t for t in live if t.end is not None])
            round_ += 1
    finally:
        _release(runner, trajs)
    return trajs, counters


def _open(t: Trajectory, opening: list[Message], renderer: ChatRenderer, settings: TurnSettings,
          counters: dict[str, float]) -> None:
    """Start ``t`` from its environment's own ``opening``; an opening over ``settings.max_prompt_tokens`` (checked
    on characters first, so a flood is not tokenised) or that the template refuses ends it as a failure."""
    limit = settings.max_prompt_tokens
    t0 = time.perf_counter()
    try:
        chars = sum(len(m["content"]) for m in opening)
        if limit and chars > limit * renderer.max_token_chars:
            _fail(t, f"reset's opening has {chars} characters, over data.max_prompt_tokens={limit} tokens: shorten "
                     "the environment's opening or raise data.max_prompt_tokens", counters)
            return
        ids = renderer.opening_ids(opening)
    except Exception as e:  # noqa: BLE001 - a template that refuses the environment's messages ends this trajectory
        _fail(t, _template_failure("reset's opening", e), counters)
        return
    finally:
        counters["render_s"] += time.perf_counter() - t0
    if limit and len(ids) > limit:
        _fail(t, f"reset's opening renders to {len(ids)} tokens, over data.max_prompt_tokens={limit}: shorten the "
                 "environment's opening or raise data.max_prompt_tokens", counters)
        return
    t.messages = [dict(m) for m in opening]
    t.seq = Segment(prompt_ids=ids)


def _template_failure(where: str, e: BaseException) -> str:
    """A chat-template error on an environment's or tool's messages as a failure text (the reason line, then the
    traceback)."""
    import traceback

    head = f"template error on {where}: {type(e).__name__}: {e}".splitlines()[0][:300]
    return head + "\n" + "".join(traceback.format_exception(e))[-3000:]


def _release(runner: EnvRunner, trajs: list[Trajectory]) -> None:
    """Hand the states of ``trajs`` not yet released to the runner's optional ``release`` (each trajectory once;
    those without a state, whose reset failed, are only marked)."""
    todo = [t for t in trajs if not t.released]
    for t in todo:
        t.released = True
    release = getattr(runner, "release", None)
    states = [t.state for t in todo if t.state is not None]
    if callable(release) and states:
        release(states)


def _sample_round(live: list[Trajectory], generate: Generate, settings: TurnSettings, sampling: SamplingConfig,
                  round_: int, turn_end_id: int | None) -> None:
    """One engine call: each live trajectory's next assistant turn, appended with its logprobs; ends those cut at
    the token limit (``length``, unless ``settings.end_on_length`` is False), those whose turn stopped on an end id
    other than ``turn_end_id`` (the template's turn end, the tokenizer's eos: ``stop_id``; Qwen2.5's
    ``<|endoftext|>``, Llama-3.1's ``<|eom_id|>``: the template would close the turn after it, training the model
    to emit that id mid-conversation) and those at ``max_turns``."""
    prompts = []
    for k, t in enumerate(live):
        seg = t.seq
        room = min(settings.max_new_tokens, settings.max_tokens - t.used)
        prompts.append(Prompt(index=k, text="", prompt_ids=seg.prompt_ids + seg.ids, gold=t.start.gold,
                              max_new_tokens=room))  # fmt: skip
    seed = None if sampling.seed is None else turn_seed(sampling.seed, round_)
    comps = generate(prompts, dataclasses.replace(sampling, n=1, seed=seed))
    for t, c in zip(live, comps):
        t.seq.add(c.token_ids, c.logprobs, c.token_versions or [c.policy_version] * len(c.token_ids))
        t.turns += 1
        t.versions.append(c.policy_version)
        t.last_text, t.last_finish = c.text, c.finish_reason
        t.messages.append({"role": "assistant", "content": c.text})
        if c.finish_reason != "stop" and (settings.end_on_length or c.finish_reason != "length"):
            t.end = c.finish_reason  # "length", or an engine's other reason (an abort)
        elif c.finish_reason == "stop" and turn_end_id is not None and c.token_ids[-1:] != [turn_end_id]:
            t.end = "stop_id"
        elif t.turns >= settings.max_turns:
            t.end = "max_turns"


def _fail(t: Trajectory, why: Any, counters: dict[str, float]) -> None:
    """End ``t`` on an infrastructure failure: ``end`` is ``env: <the first line of why>``, ``failure`` the whole
    text (a traceback may follow the first line)."""
    text = str(why)
    t.end = "env: " + (text.splitlines()[0] if text.strip() else "unknown failure")
    t.failure = text
    counters["env_failures"] += 1


def _answer(t: Trajectory, state: Any, step: Any, renderer: ChatRenderer, settings: TurnSettings,
            counters: dict[str, float]) -> None:
    """Append an environment's answer (or end the trajectory on a failure, ``done``, the budget, a template that
    rewrites history or refuses the answer). A trajectory that already ended (its last reply, stepped for its
    reward: ``settings.step_last``) keeps the reward and info only. The answer's messages join ``t.messages`` only
    when their ids join the sequence: the conversation shows what the model saw."""
    if state is None:
        _fail(t, step, counters)
        return
    assert isinstance(step, EnvStep)
    t.state = state
    t.turn_rewards.append(step.reward)
    t.info.append(step.info)
    if t.end is not None:  # the last reply, scored; nothing answers it
        return
    if step.done:
        t.end = "done"
        return
    t0 = time.perf_counter()
    try:
        new, cut = cap_observation(step.messages, renderer, settings.max_observation_tokens)
        counters["obs_tokens_cut"] += cut
        room = settings.max_tokens - t.used - 1  # the next turn needs one token at least
        chars = sum(len(m["content"]) for m in new)
        if chars > max(room, 0) * renderer.max_token_chars:
            t.end = "budget"  # more characters than the budget's tokens could hold: not tokenised
            t.info[-1] = {**t.info[-1], "not_shown": f"the environment's answer ({chars} characters) cannot fit the "
                                                     f"{max(room, 0)} tokens left of environment.max_tokens"}
            return
        history, reply = t.messages[:-1], t.messages[-1]
        b = renderer.between(history, reply["content"], t.seq.ids[-1:] == [renderer.eos_id], new)
    except Exception as e:  # noqa: BLE001 - a template that refuses the environment's messages ends this trajectory
        _fail(t, _template_failure("the environment's answer", e), counters)
        return
    finally:
        counters["render_s"] += time.perf_counter() - t0
    if not b.prefix_ok:  # the template rewrote history: end here, never train on ids the template would not give
        t.broken += 1
        counters["prefix_breaks"] += 1
        t.end = "prefix_broken"
        t.info[-1] = {**t.info[-1], "prefix_broken": b.reason}
        return
    if t.used + len(b.ids) + 1 > settings.max_tokens:
        t.end = "budget"
        t.info[-1] = {**t.info[-1], "not_shown": f"the environment's answer takes {len(b.ids)} tokens with the "
                                                 f"template's; {settings.max_tokens - t.used - 1} left of "
                                                 "environment.max_tokens"}
        return
    t.messages += new
    t.seq.add(b.ids, None)
