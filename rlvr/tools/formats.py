"""Call formats: how a model writes a tool call in its reply, parsed back into calls.

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call (Qwen2.5, Qwen3,
  SmolLM3, Hermes and others);
- ``llama3``: the whole reply is a JSON object ``{"name": ..., "parameters": {...}}`` (Llama-3.1/3.2/3.3's JSON tool
  calling), optionally after ``<|python_tag|>``; several objects may be separated by ``;``;
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list ``[{"name": ..., "arguments": {...}}, ...]`` (or the newer
  ``[TOOL_CALLS]name[ARGS]{...}`` form). ``[TOOL_CALLS]`` is a special token of Mistral's tokenizers, which the
  engines' text leaves out (vLLM's and transformers' ``skip_special_tokens``), as it leaves out ``[ARGS]``, so a
  reply that is only such a JSON list of calls (each an object with a ``"name"``), or only ``name{...}`` calls, is
  read as calls too, as ``llama3`` reads a reply without its ``<|python_tag|>``.

A reply holds calls (each parsed, or the reason it is malformed) or none (a final answer). Parsing never raises:
model output is untrusted. :func:`detect_format` picks the format from a chat template's source.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

Format = Literal["hermes", "llama3", "mistral"]
FORMATS: tuple[str, ...] = ("hermes", "llama3", "mistral")


@dataclass(frozen=True)
class ParsedCall:
    """One call found in a reply: ``name`` and ``arguments`` when it parsed (the arguments not yet checked against
    the tool's schema), else ``error`` says what is wrong with it (``name`` may still be known). ``raw``: its text;
    ``id``: the id the model gave the call (Mistral's ``"id"`` / ``[CALL_ID]``), None when it gave none."""

    name: str | None
    arguments: Any
    error: str | None
    raw: str
    id: str | None = None


def _json_error(e: json.JSONDecodeError) -> str:
    return f"not valid JSON ({e.msg} at character {e.pos})"


def _from_object(obj: Any, raw: str, args_keys: tuple[str, ...]) -> ParsedCall:
    """A call from a decoded ``{"name": ..., "arguments" | "parameters": ...}`` (arguments given as a JSON string
    are decoded)."""
    if not isinstance(obj, dict):
        return ParsedCall(None, None, f"a tool call is a JSON object with \"name\" and \"{args_keys[0]}\", got "
                                      f"{type(obj).__name__}", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ParsedCall(None, None, f"the tool call has no \"name\" (a string): {raw[:200]}", raw)
    key = next((k for k in args_keys if k in obj), None)
    args = obj.get(key, {}) if key else {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ParsedCall(name, None, f"the \"{key}\" of {name} are a string that is {_json_error(e)}", raw)
    given = obj.get("id")
    return ParsedCall(name, args, None, raw, given if isinstance(given, str) and given else None)


_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.DOTALL)


def _hermes(text: str) -> list[ParsedCall]:
    out = []
    for m in _HERMES.finditer(text):
        body, raw = m.group(1).strip(), m.group(0)
        if not m.group(2):
            out.append(ParsedCall(None, None, "the <tool_call> block is not closed with </tool_call>", raw))
            continue
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            out.append(ParsedCall(None, None, f"the <tool_call> block is {_json_error(e)}: {body[:200]}", raw))
            continue
        out.append(_from_object(obj, raw, ("arguments", "parameters")))
    return out


def _json_objects(text: str, sep: str) -> list[ParsedCall] | str:
    """Consecutive JSON values in ``text`` separated by whitespace or ``sep``; a string: why it does not parse."""
    dec, pos, values = json.JSONDecoder(), 0, []
    while pos < len(text):
        while pos < len(text) and (text[pos].isspace() or text[pos] == sep):
            pos += 1
        if pos >= len(text):
            break
        try:
            obj, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            return _json_error(e)
        values.append((obj, text[pos:end]))
        pos = end
    return values


def _llama3(text: str) -> list[ParsedCall]:
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].strip()
    elif not body.startswith("{"):
        return []  # prose: a final answer
    found = _json_objects(body, ";")
    if isinstance(found, str):
        return [ParsedCall(None, None, f"the tool call is {found}: {body[:200]}", body)]
    return [_from_object(obj, raw, ("parameters", "arguments")) for obj, raw in found]


_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*(?:\[CALL_ID\]\s*(\S+?)\s*)?\[ARGS\]")


_BARE_NAMED = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*(?=\{)")


def _bare_mistral(text: str) -> list[ParsedCall]:
    """The calls of a reply whose special tokens the engine's text dropped (``[TOOL_CALLS]``, and ``[ARGS]`` of the
    newer form): a reply that is only a JSON list of call objects, or only ``name{...}`` calls one after another;
    ``[]`` (a final answer) for anything else, however it starts."""
    body, dec = text.strip(), json.JSONDecoder()
    if body.startswith("["):
        try:
            value, end = dec.raw_decode(body)
        except json.JSONDecodeError:
            return []
        if body[end:].strip() or not value or not all(isinstance(v, dict) and "name" in v for v in value):
            return []
        return [_from_object(obj, json.dumps(obj), ("arguments", "parameters")) for obj in value]
    out, pos = [], 0
    while pos < len(body):
        m = _BARE_NAMED.match(body, pos)
        if not m:
            return []
        try:
            args, end = dec.raw_decode(body, m.end())
        except json.JSONDecodeError:
            return []
        if not isinstance(args, dict):
            return []
        out.append(ParsedCall(m.group(1), args, None, body[pos:end].strip()))
        pos = end
        while pos < len(body) and body[pos].isspace():
            pos += 1
    return out


def _mistral(text: str) -> list[ParsedCall]:
    at = text.find("[TOOL_CALLS]")
    if at < 0:
        return _bare_mistral(text)
    rest = text[at + len("[TOOL_CALLS]"):]
    out: list[ParsedCall] = []
    if rest.lstrip().startswith("["):
        found = _json_objects(rest.lstrip(), ",")
        if isinstance(found, str):
            return [ParsedCall(None, None, f"the [TOOL_CALLS] list is {found}: {rest[:200]}", rest)]
        for value, _ in found:  # each value a list of calls or one call: `[{..}], [{..}]` gives the calls of both
            items = value if isinstance(value, list) else [value]
            out += [_from_object(obj, json.dumps(obj), ("arguments", "parameters")) for obj in items]
        return out
    dec = json.JSONDecoder()
    while rest.strip():
        m = _MISTRAL_NAMED.match(rest)
        if not m:
            out.append(ParsedCall(None, None, "after [TOOL_CALLS] comes a JSON list of calls or name[ARGS]{...}: "
                                              f"{rest[:200]}", rest))
            break
        try:
            args, end = dec.raw_decode(rest, m.end())
        except json.JSONDecodeError as e:
            out.append(ParsedCall(m.group(1), None, f"the arguments of {m.group(1)} are {_json_error(e)}", rest))
            break
        out.append(ParsedCall(m.group(1), args, None, rest[:end], m.group(2)))
        rest = rest[end:]
        rest = rest[len("[TOOL_CALLS]"):] if rest.lstrip().startswith("[TOOL_CALLS]") else rest
    return out


_PARSERS = {"hermes": _hermes, "llama3": _llama3, "mistral": _mistral}


def parse_calls(text: str, fmt: str) -> list[ParsedCall]:
    """The calls in a reply written in ``fmt`` (``[]``: none, a final answer). Never raises."""
    try:
        return _PARSERS[fmt](text)
    except RecursionError:  # deeply nested JSON
        return [ParsedCall(None, None, "the tool call is nested too deeply", text[:200])]


def detect_format(chat_template: str | None) -> str | None:
    """The call format a chat template teaches its model, from its source: ``<tool_call>`` -> hermes,
    ``[TOOL_CALLS]``, ``[AVAILABLE_TOOLS]`` or ``[TOOL_RESULTS]`` -> mistral, ``<|python_tag|>`` or an ``ipython``
    role -> llama3; None when it names none."""
    src = chat_template or ""
    if "<tool_call>" in src:
        return "hermes"
    if any(m in src for m in ("[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[TOOL_RESULTS]")):
        return "mistral"
    if "<|python_tag|>" in src or "ipython" in src:
        return "llama3"
    return None


def template_lists_tools(chat_template: str | None) -> bool:
    """True when the template renders a ``tools`` variable (so ``apply_chat_template(..., tools=...)`` lists them)."""
    return bool(re.search(r"\btools\b", chat_template or ""))


_HOWTO = {
    "hermes": 'For each call, reply with a JSON object inside <tool_call></tool_call> tags:\n<tool_call>\n'
              '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>',
    "llama3": 'To call a function, reply with only a JSON object: {"name": <function-name>, "parameters": '
              '<args-json-object>}',
    "mistral": 'To call functions, reply with [TOOL_CALLS] followed by a JSON list: [TOOL_CALLS][{"name": '
               '<function-name>, "arguments": <args-json-object>}]',
}  # fmt: skip


def example_call(name: str, arguments: dict[str, Any], fmt: str) -> str:
    """A reply that calls ``name`` with ``arguments`` in ``fmt``, written as the format's how-to teaches it
    (:data:`_HOWTO`): what the load-time template check (:func:`rlvr.envs.template_check.checked_renderer`) has
    the model reply, so the probe renders the replies the run will. :func:`parse_calls` reads it back."""
    if fmt == "hermes":
        return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'
    if fmt == "llama3":
        return json.dumps({"name": name, "parameters": arguments})
    return "[TOOL_CALLS]" + json.dumps([{"name": name, "arguments": arguments}])


def describe_tools(schemas: list[dict[str, Any]], fmt: str) -> str:
    """A system-prompt text listing the tools and how to call them in ``fmt``: for chat templates that do not render
    ``tools`` themselves."""
    listing = "\n".join(json.dumps(s) for s in schemas)
    return (f"You may call functions to help with the task. The functions, as JSON schemas:\n<tools>\n{listing}\n"
            f"</tools>\n{_HOWTO[fmt]}\nThe results come back in the next message. When you have the answer, reply "
            "without a call.")


def with_system(messages: list[dict[str, Any]], system: str | None) -> list[dict[str, Any]]:
    """``messages`` with ``system`` (the tools' listing, :func:`describe_tools`) appended to their system message,
    or as a new first system message; unchanged when ``system`` is None. The first prompt of a trajectory with tools
    (:meth:`rlvr.tools.runner.ToolRunner.reset`) and the load-time length check (:func:`rlvr.data.build_prompts`)
    both build it here."""
    if not system:
        return messages
    msgs = [dict(m) for m in messages]
    if msgs and msgs[0]["role"] == "system":
        msgs[0] = {**msgs[0], "content": msgs[0]["content"] + "\n\n" + system}
    else:
        msgs.insert(0, {"role": "system", "content": system})
    return msgs


@dataclass(frozen=True)
class ToolListing:
    """How a recipe's tools reach the model: ``tools`` (resolved, :class:`rlvr.tools.registry.Tool`), ``fmt`` (the
    call format), ``template_tools`` (the schemas the chat template renders as ``tools=``; None when it renders
    none) or ``system`` (the system text listing them, for a template that does not; None otherwise), and
    ``call_ids`` (the template reads a ``tool_call_id`` on tool messages)."""

    tools: list[Any]
    fmt: str
    template_tools: list[dict[str, Any]] | None
    system: str | None
    call_ids: bool

    def template_kwargs(self) -> dict[str, Any]:
        """The ``apply_chat_template`` keyword arguments that list the tools (``{"tools": [...]}`` or ``{}``)."""
        return {"tools": self.template_tools} if self.template_tools is not None else {}

    def opening(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The opening conversation as the first prompt carries it (:func:`with_system`)."""
        return with_system(messages, self.system)


def tool_listing(names: tuple[str, ...] | list[str], fmt: str, chat_template: str | None) -> ToolListing:
    """The listing of the tools ``names`` for a model whose chat template is ``chat_template``: the call format
    ``fmt`` (``auto``: the template's, else hermes), the template's own ``tools=`` rendering when it has one, else a
    system message. Errors: those of :func:`rlvr.tools.registry.resolve_tools`."""
    from rlvr.tools.registry import resolve_tools

    resolved = resolve_tools(names)
    chosen = fmt if fmt != "auto" else detect_format(chat_template) or "hermes"
    schemas = [t.schema for t in resolved]
    listed = template_lists_tools(chat_template)
    return ToolListing(tools=resolved, fmt=chosen, template_tools=schemas if listed else None,
                       system=None if listed else describe_tools(schemas, chosen),
                       call_ids="tool_call_id" in (chat_template or ""))  # fmt: skip


def recipe_tool_listing(tools: Any, data: Any, tokenizer: Any) -> ToolListing | None:
    """The listing of a ``tools`` section (:class:`~rlvr.config.ToolsConfig`) for the run's chat template (the
    tokenizer's, or ``data.chat_template_path``'s, which is set on ``tokenizer``:
    :func:`rlvr.data.datasets.with_chat_template`) (:func:`tool_listing`), so that prompt lengths count the
    tool schemas the first prompt carries (training, its validation, ``rlvr eval``); None without tools or when
    ``data`` (:class:`~rlvr.config.DataConfig`) renders no chat template. Errors: :class:`~rlvr.config.RecipeError`
    naming ``tools.names`` when a tool does not resolve, those of ``with_chat_template``."""
    if not tools.enabled or not data.chat_template:
        return None
    from rlvr.config import RecipeError
    from rlvr.data.datasets import with_chat_template

    with_chat_template(tokenizer, data)  # the run's template (data.chat_template_path) decides format and listing
    try:
        return tool_listing(tools.names, tools.format, getattr(tokenizer, "chat_template", None))
    except (KeyError, ImportError, AttributeError, TypeError, ValueError, OSError) as e:
        raise RecipeError(f"tools.names: {str(e).strip(chr(34))}") from None
