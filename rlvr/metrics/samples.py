"""Sample tables: a few rollouts of a step (prompt, response, parsed answer, reward, reason) for a human to read.

:func:`sample_rows` picks the rows (a fixed, documented choice, so tables of different steps are comparable);
the controller hands them to ``MultiSink.log_table`` (``RUN/samples.jsonl``, W&B, MLflow, TensorBoard) and to
:func:`print_sample_table` (the console) every ``metrics.samples_every`` steps. A multi-turn trajectory's row
carries its structure as ``rlvr eval``'s ``samples.jsonl`` does (:func:`trajectory_fields`: the conversation, the
per-turn rewards, the environment's info, each tool call's name and outcome, the end reason and a failure's text);
:func:`log_first_prompt` shows the run's first prompt as the model sees it.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence, TextIO

from rlvr.metrics.sinks import json_cell
from rlvr.types import Completion, Prompt

log = logging.getLogger("rlvr")

COLUMNS = ("prompt_index", "sample_index", "prompt", "gold", "response", "parsed", "score", "reward", "reason", "finish",
           "judge")
"""Keys of each row of :func:`sample_rows`, in order."""
TRAJECTORY_COLUMNS = ("turns", "end_reason", "failure", "opening_messages", "messages", "turn_rewards", "turn_info",
                      "tool_calls")  # fmt: skip
"""Keys a multi-turn trajectory's row has after :data:`COLUMNS` (:func:`trajectory_fields`), in order."""


def _pick(correct: list[bool], order: list[int], n_rows: int) -> list[int]:
    """Positions of the rows: the first ``n_rows`` of ``order``; when ``n_rows >= 2`` and they are all correct (or
    all wrong) while ``order`` has a sample of the other kind, the last of them is swapped for the first such."""
    chosen = order[:n_rows]
    if n_rows < 2 or not chosen:
        return chosen
    kinds = {correct[i] for i in chosen}
    if len(kinds) == 1:
        other = next((i for i in order if correct[i] != correct[chosen[0]]), None)
        if other is not None:
            chosen[-1] = other
    return chosen


def sample_rows(
    prompts: Sequence[Prompt],
    completions: Sequence[Completion],
    scored: Sequence[Any],
    primary: str,
    n_rows: int,
) -> list[dict[str, Any]]:
    """Up to ``n_rows`` rows describing sampled completions of one step, as flat dicts with keys :data:`COLUMNS`.

    Inputs: ``completions`` [B] and ``scored`` [B] (``rlvr.reward.pool.Scored``) aligned, prompt-major as the
    controller has them; ``prompts``: the Prompt objects they came from (matched by ``Prompt.index`` ==
    ``Completion.prompt_index``; extra prompts are ignored); ``primary``: the verifier key whose verdict fills
    ``parsed``, ``score`` and ``reason`` (a sample is correct when that score >= 1, as in the pass@k metrics).

    Choice (fixed): order the B completions round-robin over prompts - the first sample of every prompt (in
    batch order), then every prompt's second sample, and so on - and take the first ``n_rows``. When
    ``n_rows >= 2`` and the batch has a correct sample but the choice has none, the last row is replaced by the
    first correct sample in that order; likewise when it has a wrong sample but the choice has none. So a table
    shows both kinds whenever the batch has both. Rows keep that order (a swapped-in row last).

    Row: ``prompt_index`` (data set row), ``sample_index``, ``prompt`` (the question before templating, else
    the templated text), ``gold``, ``response`` (decoded text; a multi-turn trajectory's final answer, the reply the
    verifiers scored), ``parsed`` (the primary verifier's answer or None), ``score`` (primary verifier, in [0, 1]),
    ``reward`` (weighted sum over verifiers), ``reason`` (None at full marks), ``finish`` (``stop`` / ``length`` /
    ``abort``; a trajectory's last turn's), ``judge`` (the judge verifier's verdict, :func:`judge_cell`; None when
    the step ran no judge). A multi-turn trajectory's row (``end_reason`` set) then has
    :data:`TRAJECTORY_COLUMNS` (:func:`trajectory_fields`); a single-turn sample's has :data:`COLUMNS` only.

    Errors: ``ValueError`` when ``completions`` and ``scored`` differ in length, a completion's prompt is not in
    ``prompts``, or ``n_rows`` < 0; ``KeyError`` when a sample has no result for ``primary``.
    """
    if len(completions) != len(scored):
        raise ValueError(f"{len(completions)} completions but {len(scored)} scored samples")
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    by_index = {p.index: p for p in prompts}
    rank: dict[int, int] = {}  # prompt index -> rank of the sample within its prompt seen so far
    keys = []
    for pos, c in enumerate(completions):
        if c.prompt_index not in by_index:
            raise ValueError(f"completion {pos} comes from prompt {c.prompt_index}, which is not in prompts")
        r = rank.get(c.prompt_index, 0)
        rank[c.prompt_index] = r + 1
        keys.append((r, pos))
    order = [pos for _, pos in sorted(keys)]
    correct = [s.results[primary].score >= 1.0 for s in scored]
    rows = []
    for pos in _pick(correct, order, n_rows):
        c, s = completions[pos], scored[pos]
        res = s.results[primary]
        p = by_index[c.prompt_index]
        rows.append(
            {
                "prompt_index": c.prompt_index,
                "sample_index": c.sample_index,
                "prompt": p.question or p.text,
                "gold": p.gold,
                "response": c.text,
                "parsed": res.parsed,
                "score": float(res.score),
                "reward": float(s.reward),
                "reason": res.reason,
                "finish": c.finish_reason,
                "judge": judge_cell(s.results.get("judge")),
                **(trajectory_fields(c) if c.end_reason is not None else {}),
            }
        )
    return rows


def trajectory_fields(c: Completion) -> dict[str, Any]:
    """A multi-turn trajectory's structure for a sample file (the training ``samples.jsonl`` rows and ``rlvr eval``'s
    records), keys :data:`TRAJECTORY_COLUMNS`, every value JSON data (:func:`rlvr.metrics.sinks.json_cell`):
    ``turns`` (assistant turns), ``end_reason`` (``done``, ``max_turns``, ``length``, ``budget``,
    ``prefix_broken``, ``env: <reason>``), ``failure`` (an infrastructure failure's whole text, its traceback where
    one was kept; None), ``opening_messages`` (how many of ``messages`` are the opening), ``messages`` (the whole
    conversation, chat messages), ``turn_rewards`` (the environment's reward after each assistant turn, None where
    it gave none), ``turn_info`` (the environment's info after each turn it answered), ``tool_calls``
    (:func:`tool_calls`)."""
    return {
        "turns": c.turns,
        "end_reason": c.end_reason,
        "failure": c.failure,
        "opening_messages": c.opening_messages,
        "messages": json_cell(c.messages or []),
        "turn_rewards": json_cell(c.turn_rewards or []),
        "turn_info": json_cell(c.turn_info or []),
        "tool_calls": tool_calls(c.turn_info),
    }


def tool_calls(turn_info: Sequence[Any] | None) -> list[dict[str, Any]]:
    """Each tool call of a trajectory, in order, as ``{"turn", "name", "status"}``: ``turn`` the assistant turn that
    made it (1-based: the environment's info after turn k is ``turn_info[k - 1]``), ``name`` the tool, ``status``
    ``ok``, ``error``, ``timeout``, ``crashed`` (:data:`rlvr.tools.execute.OUTCOMES`) or ``malformed`` (answered with
    an error, not run), as the tool runner records them in the turn's ``info["tool_calls"]``
    (:class:`rlvr.tools.runner.ToolRunner`). Empty without tools."""
    out = []
    for k, info in enumerate(turn_info or []):
        calls = info.get("tool_calls") if isinstance(info, dict) else None
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                out.append({"turn": k + 1, "name": str(call.get("name", "unknown")), "status": str(call.get("status"))})
    return out


def log_first_prompt(prompt: Prompt, tokenizer: Any) -> str:
    """Log once (logger ``rlvr``, info: the console and ``train.log``) the run's first prompt as the model sees it:
    its ids decoded with every special token (the chat template's markup, the system text, the tools listing when
    the recipe has tools: the prompts are rendered with it, :func:`rlvr.data.build_prompts`). An environment whose
    ``reset`` returns an opening of its own starts its trajectories from that instead. Returns the line logged."""
    text = tokenizer.decode(list(prompt.prompt_ids), skip_special_tokens=False)
    line = f"the first prompt (data row {prompt.index}, {len(prompt.prompt_ids)} tokens) as the model sees it:\n{text}"
    log.info(line)
    return line


def conversation_text(messages: Sequence[dict[str, Any]], opening: int = 0) -> str:
    """A trajectory's conversation as text for a sample table: every message after the opening (its first
    ``opening`` messages, :attr:`rlvr.types.Completion.opening_messages`, e.g. few-shot turns; 0: up to the first
    user message), each headed by its role, assistant turns numbered:
    ``[assistant 1] 8 / [user] higher / [assistant 2] 12``."""
    start = opening or next((i + 1 for i, m in enumerate(messages) if m.get("role") == "user"), 0)
    parts, turn = [], 0
    for m in messages[start:]:
        role = m.get("role", "?")
        if role == "assistant":
            turn += 1
            role = f"assistant {turn}"
        parts.append(f"[{role}] {m.get('content', '')}")
    return " / ".join(parts)


def judge_cell(verdict: Any) -> str | None:
    """A judge verdict (:mod:`rlvr.reward.judge`) for a table: ``sound (-1)`` at full marks, else its reason with
    what it parsed (``flawed (2)``, ``not_judged``, ``judge_unparseable: '...'``); None for no verdict."""
    if verdict is None:
        return None
    what = "sound" if verdict.reason is None else verdict.reason
    return f"{what} ({verdict.parsed})" if verdict.parsed is not None else what


def shorten(text: Any, width: int) -> str:
    """``text`` on one line (newlines shown as ``⏎``) and at most ``width`` characters: when longer, its head
    and tail around `` … `` (the head shows how a response starts, the tail its final answer)."""
    s = "" if text is None else str(text)
    s = s.replace("\r\n", "\n").replace("\n", "⏎")
    if len(s) <= width:
        return s
    keep = max(width - 3, 2)
    head = (keep + 1) // 2
    return s[:head] + " … " + s[len(s) - (keep - head):]


def print_sample_table(
    step: int,
    rows: Sequence[Mapping[str, Any]],
    *,
    width: int = 60,
    file: TextIO | None = None,
) -> None:
    """Print ``rows`` (from :func:`sample_rows`) as a ``rich`` table titled ``samples at step N``.

    Columns: ``#`` (prompt_index/sample_index), prompt, response (a trajectory's conversation after its opening,
    :func:`conversation_text`; each cut to ``width`` characters by :func:`shorten`), gold, parsed, reward (4
    decimals; ``excluded`` for a trajectory ended by an infrastructure failure, which is not trained on:
    :func:`rlvr.runtime.rollout_stage.infra_failed`), reason (``ok`` when None), and for trajectories how each ended
    (``ended``: ``done``, ``max_turns``, ``budget``, ``env: <reason>`` ...). ``file``: where to print (default:
    stdout). Prints nothing for no rows.
    """
    if not rows:
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"samples at step {step}", show_lines=True)
    judged = any(row.get("judge") is not None for row in rows)
    ended = any(row.get("end_reason") is not None for row in rows)
    for name, kw in (("#", {"no_wrap": True}), ("prompt", {}), ("response", {}), ("gold", {}), ("parsed", {}),
                     ("reward", {"justify": "right", "no_wrap": True}), ("reason", {})) + \
            ((("judge", {}),) if judged else ()) + ((("ended", {}),) if ended else ()):  # fmt: skip
        table.add_column(name, **kw)
    for row in rows:
        reward = row.get("reward")
        messages = row.get("messages")
        response = conversation_text(messages, row.get("opening_messages") or 0) if messages else row.get("response")
        cells = [
            f"{row.get('prompt_index', '')}/{row.get('sample_index', '')}",
            shorten(row.get("prompt"), width),
            shorten(response, width),
            shorten(row.get("gold"), 24),
            shorten(row.get("parsed"), 24),
            "excluded" if row.get("failure") else "" if reward is None else f"{float(reward):.4f}",
            shorten(row.get("reason") or "ok", 24),
            *([shorten(row.get("judge"), 24)] if judged else []),
            *([shorten(row.get("end_reason") or "", 32)] if ended else []),
        ]
        # model text is not rich markup: "[assistant 1]" / "[user]" turn marks (and any "[/x]" a model writes)
        # would be read as style tags and dropped
        table.add_row(*(Text(c) for c in cells))
    Console(file=file, soft_wrap=False).print(table)
