"""The chat template of a multi-turn run, checked before it is used: one function (:func:`checked_renderer`) that
the run (:class:`rlvr.envs.rollout.TurnRollouts`, also ``rlvr eval --environment / --tools``) and ``rlvr train
--dry-run`` (:func:`rlvr.runtime.checks.check_chat_template`) both call, so what the dry run passes the run passes.

It renders the run's template (the tokenizer's, or ``data.chat_template_path``'s:
:func:`rlvr.data.datasets.with_chat_template`) with the run's tools listing, and probes it with the trajectory the
run makes (:func:`rlvr.envs.tokens.check_template`): a system message, replies with reasoning, with tools two
replies calling a tool in the recipe's call format each answered by the ``tool`` messages the run's own tool
environment builds for it (:class:`rlvr.tools.runner.ToolRunner` on a pool that runs nothing), and with an
environment a user message after a reply. A template that fails is refused with the reason and the fix
(``data.chat_template_path``).
"""

from __future__ import annotations

from typing import Any

from rlvr.config import DataConfig, RecipeError, ToolsConfig
from rlvr.envs.tokens import ChatRenderer, Message, check_template, probe_opening

FIX = ("data.chat_template_path: a Jinja file that extends the conversation, or a template shipped in rlvr: chatml "
       "(turns ended by the eos token, earlier reasoning kept, tools listed in the system message, Hermes calls) or "
       "mistral (Mistral's layout with the tools before the first user message; tools.format: mistral)")
"""The fix a refused template's message gives (:mod:`rlvr.data.chat_templates`)."""


class _ProbePool:
    """A tool pool (:class:`rlvr.tools.execute.ToolPool`'s methods) that runs nothing: every call returns ``4``, every
    stateful instance is created empty. The probe needs the shape of the run's tool messages, not a result."""

    def run(self, calls: list[tuple[Any, Any]], states: list[bytes | None] | None = None) -> list[Any]:
        from rlvr.tools.execute import ToolResult

        return [ToolResult(tool.name, "ok", "4", state=state) for (tool, _), state in
                zip(calls, states or [None] * len(calls))]  # fmt: skip

    def create(self, tools: list[Any]) -> list[tuple[bytes | None, str | None]]:
        return [(b"", None) for _ in tools]

    def close_instances(self, items: list[Any]) -> list[str | None]:
        return [None for _ in items]


def tool_settings(tools: ToolsConfig, listing: Any) -> Any:
    """The :class:`~rlvr.tools.runner.ToolSettings` of the recipe's ``tools`` section listed as ``listing``
    (:class:`~rlvr.tools.formats.ToolListing`): the run's tool environment (:func:`rlvr.envs.rollout.tool_runner`)
    and the probe build their messages with the same."""
    from rlvr.tools.runner import ToolSettings

    return ToolSettings(fmt=listing.fmt, max_calls_per_turn=tools.max_calls_per_turn, system=listing.system,
                        call_ids=listing.call_ids)  # fmt: skip


def list_tools(tools: ToolsConfig, renderer: ChatRenderer) -> Any:
    """The recipe's tools resolved and listed for the model (:func:`rlvr.tools.formats.tool_listing`): the call
    format (``tools.format``, else the template's, else hermes), and the template's ``tools=`` rendering (set in
    ``renderer.template_kwargs`` here, so every later rendering carries it) or, for a template without one, the
    system text :class:`~rlvr.tools.runner.ToolRunner` adds to each opening."""
    from rlvr.tools.formats import tool_listing

    listing = tool_listing(tools.names, tools.format, renderer.tokenizer.chat_template)
    renderer.template_kwargs.update(listing.template_kwargs())
    return listing


def tool_round(tools: ToolsConfig, listing: Any) -> tuple[str, Any]:
    """The probe's tool round (:data:`rlvr.envs.tokens.ToolRound`): a call of the first listed tool in the recipe's
    format (:func:`rlvr.tools.formats.example_call`, no arguments) and the run's tool environment answering it."""
    from rlvr.tools.formats import example_call
    from rlvr.tools.runner import NO_ENVIRONMENT, ToolRunner, ToolState

    runner = ToolRunner(listing.tools, tool_settings(tools, listing), _ProbePool())

    def respond(history: list[Message], reply: str) -> list[Message]:
        (_, step), = runner.step([(ToolState(NO_ENVIRONMENT), history, {"role": "assistant", "content": reply})])
        return list(step.messages)

    return example_call(listing.tools[0].name, {}, listing.fmt), respond


def checked_renderer(tokenizer: Any, data: DataConfig, environment: bool, tools: ToolsConfig | None,
                     model: str) -> tuple[ChatRenderer, Any]:
    """The renderer of a multi-turn run and its tools listing (None without tools), once its template passed the
    probe (module docstring). ``tokenizer``: the model's (the template of ``data.chat_template_path`` is set on it);
    ``environment``: the recipe has an environment (its messages are user turns); ``tools``: the recipe's
    ``tools`` section (None or without names: no tools); ``model``: named in the messages.

    Errors: :class:`~rlvr.config.RecipeError` naming the model, the reason and the fix (:data:`FIX`) for a template
    that is missing or fails the probe; ``tools.names`` for a tool that does not resolve; those of
    :func:`rlvr.data.datasets.with_chat_template`."""
    from rlvr.data.datasets import with_chat_template

    with_chat_template(tokenizer, data)
    which = (f"the chat template of data.chat_template_path={data.chat_template_path!r}" if data.chat_template_path
             else f"the chat template of {model}")
    try:
        renderer = ChatRenderer(tokenizer)
    except ValueError as e:
        raise RecipeError(f"{e}; or give one: {FIX}") from None
    tools = tools if tools is not None and tools.enabled else None
    listing, round_ = None, None
    if tools is not None:
        try:
            listing = list_tools(tools, renderer)
        except (KeyError, ImportError, AttributeError, TypeError, ValueError, OSError) as e:
            raise RecipeError(f"tools.names: {str(e).strip(chr(34))}") from None
        round_ = tool_round(tools, listing)
    opening = probe_opening(data.system_prompt)
    if listing is not None:
        opening = listing.opening(opening)
    why = check_template(renderer, opening, round_, environment)
    if why:
        fmt = f", tools.format {listing.fmt}" if listing is not None else ""
        raise RecipeError(f"{which} cannot carry a multi-turn trajectory token for token (probed with a system "
                          f"message{', the tools listing, tool calls and tool messages' if tools else ''}"
                          f"{', an environment message' if environment else ''}{fmt}): {why}. Fix: {FIX}")
    return renderer, listing
