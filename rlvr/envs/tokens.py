"""Token-in/token-out: the ids of a multi-turn trajectory, built from the engine's sampled ids and the chat template.

The engine's sampled ids are never re-tokenised. Between two assistant turns rlvr appends only what the model did
not sample: the end of the assistant's turn (the template's closing after the content: ChatML's ``\\n`` after
``<|im_end|>``, or the whole closing when the turn was cut at the token limit), the environment's messages and the
next assistant header. Those ids are the chat template's rendering of the conversation *with* the new messages
minus its rendering *without* them (the method TRL and verl's agent loop use; DESIGN.md "Multi-turn"), so the
turn separator at each boundary is the template's own and nothing the model wrote is duplicated.

Each turn checks the **prefix property**: the rendering with the new messages starts with the rendering without
them, and the rendering of the conversation with the assistant's message starts with the generation prompt it was
sampled from. A template that rewrites history (Qwen3-style templates drop earlier turns' ``<think>`` blocks) breaks
it; :meth:`ChatRenderer.between` then says so (``Between.prefix_ok`` False, with the reason), and the caller starts
a new training sequence from the template's rendering of the whole conversation (the prefix is re-rendered, never
silently drifted from what was sampled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

Message = dict[str, Any]
"""One chat message in the Hugging Face format: ``{"role": "user" | "assistant" | "system" | "tool", "content": str}``."""


@dataclass(frozen=True)
class Between:
    """What goes between two assistant turns.

    ``ids``: [K] token ids to append after the sampled ids (loss mask 0): the rest of the assistant's closing, the
    new messages, the next generation prompt. ``prefix_ok``: the template extended the conversation (the two
    checks of the module docstring); when False, ``ids`` is empty and ``reason`` says which check failed.
    """

    ids: list[int]
    prefix_ok: bool
    reason: str | None = None


class ChatRenderer:
    """Renders conversations with a tokenizer's chat template and cuts the ids between turns.

    ``template_kwargs`` are passed to ``apply_chat_template`` (e.g. ``{"enable_thinking": False}``, ``tools``).
    Text is tokenized with ``add_special_tokens=False`` (the template holds BOS), as single-turn prompts are
    (:func:`rlvr.data.build_prompts`).

    Errors: ``ValueError`` when the tokenizer has no chat template.
    """

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer ({getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)}) has no "
                             "chat template: multi-turn rollouts need one (use an instruct model)")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        eos = tokenizer.eos_token_id
        self.eos_id: int | None = eos
        self.eos_text: str = tokenizer.convert_ids_to_tokens(eos) if eos is not None else ""
        self._max_token_chars: int | None = None

    @property
    def max_token_chars(self) -> int:
        """The most characters one token of the vocabulary decodes to, bounded above by its longest vocabulary
        string (a byte-level token's string has a character per byte): a text of ``n * max_token_chars`` characters
        holds at least ``n`` tokens, so a flood can be cut or refused before it is tokenised."""
        if self._max_token_chars is None:
            self._max_token_chars = max(1, max((len(t) for t in self.tokenizer.get_vocab()), default=1))
        return self._max_token_chars

    def render(self, messages: list[Message], generation_prompt: bool) -> str:
        """The template's text for ``messages`` (with the assistant header at the end when ``generation_prompt``)."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  **self.template_kwargs)

    def encode(self, text: str) -> list[int]:
        """``text``'s ids, no special tokens added."""
        # verbose=False: a long text (an observation's head, cut right after) is not a model input, so
        # transformers' "longer than the specified maximum sequence length" warning would only mislead
        return list(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def opening_ids(self, messages: list[Message]) -> list[int]:
        """[L] the ids of the opening conversation with the generation prompt: the first turn's prompt."""
        return self.encode(self.render(messages, generation_prompt=True))

    def between(self, history: list[Message], assistant: str, ended_with_eos: bool,
                new: list[Message]) -> Between:
        """The ids between the assistant's turn (``assistant``: the text of what it sampled, eos excluded) and the
        next one, given the conversation before it (``history``) and the environment's ``new`` messages.

        ``ended_with_eos``: the sampled ids end with the eos id (the model closed its turn; the template's closing
        then starts with that token, which is not appended twice); False when the turn was cut at the token limit
        (the whole closing is appended).
        """
        asked = self.render(history, generation_prompt=True)
        asst_msg: Message = {"role": "assistant", "content": assistant}
        with_asst = self.render(history + [asst_msg], generation_prompt=False)
        if not with_asst.startswith(asked):
            return Between([], False, "the template renders the assistant's message after a different prefix than "
                                      "the generation prompt it was sampled from")
        body = with_asst[len(asked):]
        if not body.startswith(assistant):
            return Between([], False, "the template rewrites the assistant's message (its content is not rendered "
                                      "as sampled)")
        closing = body[len(assistant):]
        if ended_with_eos:
            if not closing.startswith(self.eos_text):
                return Between([], False, f"the template closes an assistant turn with {closing[:20]!r}, not with the "
                                          f"eos token {self.eos_text!r} the model stops on")
            closing = closing[len(self.eos_text):]
        nxt = self.render(history + [asst_msg] + list(new), generation_prompt=True)
        if not nxt.startswith(with_asst):
            return Between([], False, "the template rewrites earlier turns when the conversation grows (history "
                                      f"is not a prefix of the longer rendering: {_first_difference(with_asst, nxt)})")
        return Between(self.encode(closing + nxt[len(with_asst):]), True)


def _first_difference(shorter: str, longer: str) -> str:
    """Where ``longer`` stops starting with ``shorter``: the character index, and 40 characters of each from 10
    before it."""
    i = next((k for k, (a, b) in enumerate(zip(shorter, longer)) if a != b), min(len(shorter), len(longer)))
    j = max(0, i - 10)
    return f"at character {i}, {shorter[j:j + 40]!r} became {longer[j:j + 40]!r}"


PROBE_REASONING = "<think>\nFirst, 2 + 2 = 4.\n</think>\n\n"
"""A reasoning block, as reasoning models write them, that starts every probe reply: templates that strip earlier
turns' reasoning (Qwen3-style) show it on the next turn."""
PROBE_REPLY = PROBE_REASONING + "The answer is 4."
"""The probe's final answer (a reply without a tool call)."""
PROBE_SYSTEM = "You are a careful assistant."
"""The probe's system message when the run gives none (:func:`probe_opening`)."""
PROBE_QUESTION = "What is 2 + 2?"
PROBE_FOLLOWUP: Message = {"role": "user", "content": "Are you sure?"}
"""What the probe's environment says after a reply (an environment's message is a user turn)."""

ToolRound = tuple[str, Callable[[list[Message], str], list[Message]]]
"""A probe's tool round: (a reply calling a tool, in the run's call format; a function of (history, reply) giving
the ``tool`` messages the run's tool environment appends for it)."""


def probe_opening(system: str | None = None) -> list[Message]:
    """The probe's opening: a system message (``system``, else :data:`PROBE_SYSTEM`: a template that drops or moves
    a system message once the conversation grows is found whether or not the recipe sets one, since rows and
    environments may bring one), then the user's question."""
    return [{"role": "system", "content": system or PROBE_SYSTEM}, {"role": "user", "content": PROBE_QUESTION}]


def check_template(renderer: ChatRenderer, opening: list[Message] | None = None, tool_round: ToolRound | None = None,
                   environment: bool = True) -> str | None:
    """None when the chat template carries the probe trajectory token for token; else the reason. The probe is the
    trajectory a run makes, every reply starting with a reasoning block (:data:`PROBE_REASONING`): from ``opening``
    (default :func:`probe_opening`), with ``tool_round`` two rounds of a reply calling a tool and the ``tool``
    messages answering it (a second round: templates that check role order fail on the reply after a tool
    message), then, with ``environment`` (or without tools), a final answer and the environment's user message
    (:data:`PROBE_FOLLOWUP`). Each reply is checked as the turn loop checks it (:meth:`ChatRenderer.between`, the
    reply closed by the eos token); a template that raises while rendering the probe is refused with its error.
    The renderer's ``template_kwargs`` are used (a recipe's ``tools=``: set them first). The load-time check of a
    multi-turn recipe (:func:`rlvr.envs.template_check.checked_renderer`, for the run and ``--dry-run`` alike)."""
    history = [dict(m) for m in (opening if opening is not None else probe_opening())]
    rounds: list[tuple[str, Callable[[list[Message], str], list[Message]], str]] = []
    if tool_round is not None:
        call, respond = tool_round
        rounds += [(PROBE_REASONING + call, respond, "a reply calling a tool, answered by its tool message")] * 2
    if environment or tool_round is None:
        rounds.append((PROBE_REPLY, lambda h, r: [dict(PROBE_FOLLOWUP)], "a final reply answered by an "
                                                                        "environment's user message"))
    for k, (reply, respond, what) in enumerate(rounds):
        where = f"probe turn {k + 1}, {what}"
        try:
            new = respond(history, reply)
            b = renderer.between(history, reply, True, new)
        except Exception as e:  # noqa: BLE001 - a user's Jinja can raise anything: the reason, not a crash
            return f"the template fails to render {where}: {type(e).__name__}: {e}"
        if not b.prefix_ok:
            return f"{b.reason} (at {where})"
        history = history + [{"role": "assistant", "content": reply}] + new
    return None
