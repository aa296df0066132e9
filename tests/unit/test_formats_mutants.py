"""The behaviours of ``rlvr/tools/formats.py`` (the call parsers, :func:`detect_format`, :func:`describe_tools`) and
``rlvr/envs/tokens.py`` (:class:`ChatRenderer`) that a mutation run (``benchmarks/mutation_score.py --module formats
--module tokens``, issue 38 item 20) showed no unit test checked. Every expectation is worked out by hand from the
input; each test names the mutants it kills."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlvr.envs.tokens import Between, ChatRenderer, _first_difference, check_template
from rlvr.tools.formats import ParsedCall, describe_tools, detect_format, parse_calls
from tests.unit.tools_templates import LLAMA, MISTRAL, QWEN, VOCAB, ids, tokenizer

REAL = Path(__file__).parent / "real_templates"


# --- formats: the call objects --------------------------------------------------------------------------------------


def test_a_call_whose_name_is_empty_or_not_a_string_is_malformed():
    """Kills ``not isinstance(name, str) or not name`` -> ``and`` (an empty name, or the number 5, became a call)."""
    text = '<tool_call>{"name": "", "arguments": {}}</tool_call>'
    assert parse_calls(text, "hermes") == [ParsedCall(None, None, f'the tool call has no "name" (a string): {text}',
                                                      text)]
    text = '{"name": 5, "parameters": {}}'
    assert parse_calls(text, "llama3") == [ParsedCall(None, None, f'the tool call has no "name" (a string): {text}',
                                                      text)]


def test_an_id_that_is_empty_or_not_a_string_is_no_id():
    """Kills ``isinstance(given, str) and given`` -> ``or`` (the id "" and the id 7 were kept)."""
    a, b = parse_calls('[TOOL_CALLS][{"name": "f", "arguments": {}, "id": ""}, '
                       '{"name": "g", "arguments": {}, "id": 7}]', "mistral")
    assert a == ParsedCall("f", {}, None, '{"name": "f", "arguments": {}, "id": ""}', None)
    assert b == ParsedCall("g", {}, None, '{"name": "g", "arguments": {}, "id": 7}', None)


def test_each_format_reads_its_other_arguments_key():
    """hermes and mistral read "parameters" when "arguments" is absent, llama3 reads "arguments": kills the
    ``'parameters' -> 'XXparametersXX'`` mutants of _hermes, _bare_mistral and _mistral and ``'arguments' ->
    'XXargumentsXX'`` of _llama3 (the arguments came back {})."""
    text = '<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>'
    assert parse_calls(text, "hermes") == [ParsedCall("f", {"x": 1}, None, text)]
    text = '{"name": "f", "arguments": {"x": 1}}'
    assert parse_calls(text, "llama3") == [ParsedCall("f", {"x": 1}, None, text)]
    obj = '{"name": "f", "parameters": {"x": 1}}'
    assert parse_calls(f"[{obj}]", "mistral") == [ParsedCall("f", {"x": 1}, None, obj)]  # [TOOL_CALLS] dropped
    assert parse_calls(f"[TOOL_CALLS][{obj}]", "mistral") == [ParsedCall("f", {"x": 1}, None, obj)]


# --- formats: llama3 ------------------------------------------------------------------------------------------------

F = '{"name": "f", "parameters": {"x": 1}}'
G = '{"name": "g", "parameters": {}}'


def test_llama3_calls_separated_by_one_semicolon():
    """Kills, in _json_objects, ``isspace() or == sep`` -> ``and``, ``pos += 1`` -> ``pos -= 1`` and ``1 -> 2``
    (the one-character separator not skipped, or skipped with the '{' after it), and _llama3's ``';' -> 'XX;XX'``."""
    assert parse_calls(F + ";" + G, "llama3") == [ParsedCall("f", {"x": 1}, None, F), ParsedCall("g", {}, None, G)]


def test_llama3_a_trailing_semicolon_ends_the_calls():
    """Kills ``pos >= len(text)`` -> ``>`` (a JSON value was looked for after the end: "Expecting value") and the
    inner loop's ``pos < len(text)`` -> ``<=`` (``text[len(text)]``: IndexError out of parse_calls)."""
    assert parse_calls(F + ";", "llama3") == [ParsedCall("f", {"x": 1}, None, F)]


def test_llama3_after_the_python_tag():
    """Kills both ``'<|python_tag|>' -> 'XX<|python_tag|>XX'`` of _llama3 (the reply read as prose: no call; or
    four characters more cut: not valid JSON)."""
    assert parse_calls("<|python_tag|>" + F, "llama3") == [ParsedCall("f", {"x": 1}, None, F)]


# --- formats: mistral -----------------------------------------------------------------------------------------------

A = '{"name": "f", "arguments": {}}'
B = '{"name": "g", "arguments": {"y": 2}}'


def test_mistral_every_value_after_tool_calls_is_read():
    """Two lists after one [TOOL_CALLS], separated by ',', or a list then a call object: both calls. A real bug: only
    the first JSON value was read (``found[:1]``), the second call dropped without a word. Kills ``',' -> 'XX,XX'``
    (not valid JSON at the ',')."""
    want = [ParsedCall("f", {}, None, A), ParsedCall("g", {"y": 2}, None, B)]
    assert parse_calls(f"[TOOL_CALLS][{A}],[{B}]", "mistral") == want
    assert parse_calls(f"[TOOL_CALLS][{A}] {B}", "mistral") == want


def test_mistral_a_list_with_trailing_space():
    """Kills the inner loop's ``pos < len(text)`` -> ``<=`` on mistral's list (IndexError at the end)."""
    assert parse_calls(f"[TOOL_CALLS] [{A}]  ", "mistral") == [ParsedCall("f", {}, None, A)]


def test_a_bare_list_with_anything_but_call_objects_is_an_answer():
    """Without [TOOL_CALLS], a JSON list is calls only when every item is an object with "name": kills ``all ->
    any`` of _bare_mistral."""
    assert parse_calls(f"[{A}, 3]", "mistral") == []
    assert parse_calls(f'[{A}, {{"arguments": {{}}}}]', "mistral") == []


def test_mistral_named_calls_with_and_without_a_call_id():
    """``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`` repeated: kills ``m.group(1) -> m.group(2)`` (the name became the
    id, or None) and both ``'[TOOL_CALLS]' -> 'XX[TOOL_CALLS]XX'`` of the second call's marker (an error, or four
    characters of the name cut)."""
    assert parse_calls('[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[CALL_ID]abc123XYZ[ARGS]{}', "mistral") == [
        ParsedCall("f", {"x": 1}, None, 'f[ARGS]{"x": 1}', None),
        ParsedCall("g", {}, None, "g[CALL_ID]abc123XYZ[ARGS]{}", "abc123XYZ"),
    ]


@pytest.mark.timeout(20)
def test_mistral_named_calls_that_do_not_parse():
    """What follows [TOOL_CALLS] is neither a list nor name[ARGS]: one error, saying what is expected; arguments that
    are not JSON: an error naming the call (the JSON error at character 15: 'f[ARGS]' is 7 characters, '{"x": 1,' 8
    more, then '}' where a property name is expected). Kills both ``break -> continue`` (the loop never ends: the
    time limit) and ``m.group(1) -> m.group(2)`` in the error."""
    assert parse_calls("[TOOL_CALLS]hello world", "mistral") == [
        ParsedCall(None, None, "after [TOOL_CALLS] comes a JSON list of calls or name[ARGS]{...}: hello world",
                   "hello world")]
    assert parse_calls('[TOOL_CALLS]f[ARGS]{"x": 1,}', "mistral") == [
        ParsedCall("f", None, "the arguments of f are not valid JSON (Expecting property name enclosed in double "
                              "quotes at character 15)", 'f[ARGS]{"x": 1,}')]


def test_a_call_nested_too_deeply_is_an_error_not_a_crash():
    """100,000 nested lists: json raises RecursionError; the call is an error with the reply's first 200 characters.
    Kills the message mutant and ``200 -> 201``."""
    text = "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>"
    assert parse_calls(text, "hermes") == [ParsedCall(None, None, "the tool call is nested too deeply",
                                                      "<tool_call>" + "[" * 189)]


# --- formats: detect_format, describe_tools -------------------------------------------------------------------------


def test_detect_format_on_real_and_test_templates():
    """The published Qwen3 and Mistral-Nemo templates and the three test families. Kills ``chat_template or ''`` ->
    ``and`` (every template read as empty: None), ``'<tool_call>' in src`` -> ``not in`` and its string mutant,
    ``any -> all`` (MISTRAL has [AVAILABLE_TOOLS] and [TOOL_RESULTS], not [TOOL_CALLS]), ``or -> and`` (LLAMA has
    ``ipython``, not ``<|python_tag|>``) and the mutants of the returned names."""
    assert detect_format((REAL / "Qwen-Qwen3-0.6B.jinja").read_text()) == "hermes"
    assert detect_format((REAL / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text()) == "mistral"
    assert [detect_format(t) for t in (QWEN, LLAMA, MISTRAL)] == ["hermes", "llama3", "mistral"]
    assert [detect_format(t) for t in (None, "", "{{ messages[0]['content'] }}")] == [None, None, None]


@pytest.mark.parametrize(("marker", "fmt"), [("[TOOL_CALLS]", "mistral"), ("[AVAILABLE_TOOLS]", "mistral"),
                                             ("[TOOL_RESULTS]", "mistral"), ("<|python_tag|>", "llama3"),
                                             ("ipython", "llama3")])
def test_detect_format_on_each_marker_alone(marker, fmt):
    """A template naming one marker alone: kills the ``'XX...XX'`` mutant of each marker."""
    assert detect_format("{%- for m in messages %}{{- '" + marker + "' + m.content }}{%- endfor %}") == fmt


def test_describe_tools_lists_one_schema_a_line():
    """Kills ``'\\n'.join`` -> ``'XX\\nXX'.join``."""
    assert describe_tools([{"name": "a"}, {"name": "b"}], "llama3") == (
        "You may call functions to help with the task. The functions, as JSON schemas:\n<tools>\n"
        '{"name": "a"}\n{"name": "b"}\n</tools>\n'
        'To call a function, reply with only a JSON object: {"name": <function-name>, "parameters": '
        "<args-json-object>}\nThe results come back in the next message. When you have the answer, reply without a "
        "call.")


# --- tokens ---------------------------------------------------------------------------------------------------------

HI = [{"role": "user", "content": "hi"}]
GO = [{"role": "user", "content": "go"}]


def test_a_tokenizer_without_an_eos_token_closes_with_the_whole_closing():
    """No eos token: eos_text is "", so a reply the probe closes 'with the eos' keeps the template's whole closing,
    and the load-time probe passes. Kills ``'' -> 'XXXX'`` (the closing did not start with 'XXXX': refused)."""
    r = ChatRenderer(tokenizer(QWEN, "<s>", None))
    assert (r.eos_id, r.eos_text) == (None, "")
    assert r.between(HI, "ok", True, GO) == Between(ids("<|im_end|>\n<|im_start|>user\ngo<|im_end|>\n"
                                                        "<|im_start|>assistant\n"), True)
    assert check_template(r) is None


def test_encode_adds_no_special_tokens_and_no_length_warning():
    """A tokenizer whose post-processor prepends <s>: encode leaves it out (kills ``add_special_tokens=False ->
    True``); a text longer than model_max_length logs no transformers warning (kills ``verbose=False -> True``)."""
    from tokenizers.processors import TemplateProcessing

    tok = tokenizer(QWEN, "<s>", "<|im_end|>")
    tok._tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", VOCAB["<s>"])])
    assert tok("ab")["input_ids"] == [VOCAB["<s>"], VOCAB["a"], VOCAB["b"]]  # the break this test guards shows
    tok.model_max_length = 4
    r = ChatRenderer(tok)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("transformers").addHandler(handler)
    try:
        assert r.encode("abcdefgh") == [VOCAB[c] for c in "abcdefgh"]
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert seen == []


def _plain(generation_prompt: str, content: str = "m.content") -> str:
    """A template writing each message as 'role:content\\n', then ``generation_prompt``."""
    return ("{%- for m in messages %}{{- m.role + ':' + " + content + " + '\\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '" + generation_prompt + "' }}{%- endif %}")


def test_between_says_which_prefix_check_failed():
    """A generation prompt 'assistant:<think>' that the rendered reply does not start with, and a template that trims
    the reply: the two reasons, asserted whole (kills their string mutants)."""
    r = ChatRenderer(tokenizer(_plain("assistant:<think>"), "<s>", "</s>"))
    assert r.between(HI, "ok", False, GO) == Between([], False, "the template renders the assistant's message after a "
                                                              "different prefix than the generation prompt it was "
                                                              "sampled from")
    r = ChatRenderer(tokenizer(_plain("assistant:", "(m.content | trim)"), "<s>", "</s>"))
    assert r.between(HI, " ok", False, GO) == Between([], False, "the template rewrites the assistant's message (its "
                                                               "content is not rendered as sampled)")


def test_first_difference_when_the_grown_rendering_is_a_prefix():
    """The grown rendering 'abc' is a strict prefix of 'abcdef' (a template that dropped the end): no character
    differs, so the index is where the shorter ends, 3 (kills ``min -> max``: 6)."""
    assert _first_difference("abcdef", "abc") == "at character 3, 'abcdef' became 'abc'"
    assert _first_difference("abcdef", "abXdef") == "at character 2, 'abcdef' became 'abXdef'"
