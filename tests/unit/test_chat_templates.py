"""The chat template of a multi-turn run (issue 38 items 8 and 13): one check for the run and ``--dry-run``
(rlvr.envs.template_check.checked_renderer) probing a system message, the tools listing, tool calls answered by the
tool runner's own tool messages and an environment's user message; the recipe key that replaces a refused template
(data.chat_template_path: a Jinja file, or chatml / mistral shipped in rlvr); the mistral call format through the
real turn loop. Templates written for these tests after the layouts they name; character-level tokenizers
(tests/unit/tools_templates.py) so every id is worked out by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.config import DataConfig, EnvironmentConfig, RecipeError, ToolsConfig
from rlvr.data.chat_templates import CHATML, MISTRAL as SHIPPED_MISTRAL
from rlvr.envs.base import EnvStep
from rlvr.envs.runner import InlineRunner
from rlvr.envs.template_check import checked_renderer, tool_settings
from rlvr.envs.tokens import ChatRenderer, check_template
from rlvr.envs.turns import TurnSettings, run_turns
from rlvr.tools.execute import ToolResult
from rlvr.tools.formats import example_call, parse_calls
from rlvr.tools.runner import ToolRunner, call_id
from rlvr.types import Completion, Prompt, SamplingConfig
from tests.unit.test_env_tokens import STRIP_THINK
from tests.unit.tools_templates import MISTRAL, QWEN, VOCAB, ids, tokenizer

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny_test.yaml"
ENV = ["environment.name=feedback", "environment.args={verifier: numeric}", "environment.max_tokens=256"]
S = "tests/unit/tools_sample.py"

# Mistral v3's published layout, written for this test: the system message folded into the user message only
# while that is the last message, the tools before the last user message, roles checked to alternate (tool
# messages skipped), a reply rendered as " " + content | trim.
MISTRAL_V3 = (
    "{%- if messages[0].role == 'system' %}{%- set system_message = messages[0].content %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}"
    "{%- set ns = namespace(index=0) %}{%- for message in loop_messages %}{%- if message.role != 'tool' %}"
    "{%- if (message.role == 'user') != (ns.index % 2 == 0) %}{{- raise_exception('After the optional system "
    "message, conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{%- set ns.index = ns.index + 1 %}{%- endif %}{%- endfor %}"
    "{{- bos_token }}{%- for message in loop_messages %}{%- if message.role == 'user' %}"
    "{%- if tools and message == user_messages[-1] %}{{- '[AVAILABLE_TOOLS] ' + (tools | tojson) + "
    "'[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{%- if loop.last and system_message is defined %}{{- '[INST] ' + system_message + '\\n\\n' + message.content + "
    "'[/INST]' }}{%- else %}{{- '[INST] ' + message.content + '[/INST]' }}{%- endif %}"
    "{%- elif message.role == 'assistant' %}{{- ' ' + message.content | trim + eos_token }}"
    "{%- elif message.role == 'tool' %}{{- '[TOOL_RESULTS] ' + message.content + '[/TOOL_RESULTS]' }}"
    "{%- endif %}{%- endfor %}"
)
# ChatML that shows the system message only inside the last user turn (a layout that drops it as a reply follows)
SYSTEM_IN_LAST_USER = (
    "{%- for m in messages %}{%- if m.role == 'user' %}{{- '<|im_start|>user\\n' + (messages[0].content + '\\n\\n' "
    "if messages[0].role == 'system' and loop.last else '') + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role != 'system' %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# QWEN that refuses a conversation whose user and assistant turns do not alternate (tool messages skipped), as
# Mistral's and Gemma's templates do: an assistant turn right after a tool message raises
ALTERNATING = ("{%- set ns = namespace(i=0) %}{%- for m in messages %}{%- if m.role in ['user', 'assistant'] %}"
               "{%- if (m.role == 'user') != (ns.i % 2 == 0) %}{{- raise_exception('roles must alternate "
               "user/assistant') }}{%- endif %}{%- set ns.i = ns.i + 1 %}{%- endif %}{%- endfor %}" + QWEN)


def _refused(tok, data=DataConfig(), environment=True, tools=None) -> str:
    with pytest.raises(RecipeError) as e:
        checked_renderer(tok, data, environment, tools, "M")
    return str(e.value)


# ----------------------------------------------------------------------------------------------------------------
# item 8: --dry-run runs the run's check, with system, tools and tool messages in the probe


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two copies of tiny-random's config and tokenizer (weights linked): ``qwen3like`` with a template that drops
    earlier turns' reasoning (STRIP_THINK), ``llama3like`` whose eos (``<pad>``) is not the turn end its template
    writes (``<|im_end|>``), as a Llama-3 config with eos ``<|end_of_text|>`` and turns ended by ``<|eot_id|>``."""
    from rlvr.models import resolve_model

    src, out = Path(resolve_model("tiny-random")), {}
    for name in ("qwen3like", "llama3like"):
        d = tmp_path_factory.mktemp(name)
        for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "chat_template.jinja"):
            shutil.copy(src / f, d / f)
        (d / "model.safetensors").symlink_to(src / "model.safetensors")
        out[name] = d
    (out["qwen3like"] / "chat_template.jinja").write_text(STRIP_THINK)
    cfg = json.loads((out["llama3like"] / "tokenizer_config.json").read_text())
    (out["llama3like"] / "tokenizer_config.json").write_text(json.dumps({**cfg, "eos_token": "<pad>"}))
    return out


@pytest.mark.parametrize("name, reason", [
    ("qwen3like", "the template rewrites earlier turns when the conversation grows"),
    ("llama3like", "the template closes an assistant turn with '<|im_end|>\\n', not with the eos token '<pad>'"),
])
def test_dry_run_refuses_the_templates_the_run_refuses_and_chatml_fixes_them(models, name, reason, capsys):
    """Issue 38 item 8: --dry-run printed "the run will start" for both (exit 0), and the run refused them when its
    turns started. Now the dry run exits 2 with the run's own message (TurnRollouts raises the same text: one
    function), naming the fix; with data.chat_template_path=chatml both pass."""
    from rlvr.envs.rollout import TurnRollouts
    from rlvr.recipe import load_recipe

    overrides = [f"model.path={models[name]}", *ENV]
    assert main(["train", str(TINY), *overrides, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rlvr train: the chat template of {models[name]} cannot carry a multi-turn trajectory "
                          "token for token (probed with a system message, an environment message): ")
    assert reason in err and "Fix: data.chat_template_path: " in err and "chatml (turns ended by the eos" in err
    r = load_recipe(TINY, overrides)
    with pytest.raises(RecipeError) as e:
        TurnRollouts(r.environment, r.data, 8, str(models[name]))
    assert f"rlvr train: {e.value}" == err
    assert main(["train", str(TINY), *overrides, "data.chat_template_path=chatml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert ("checked: chat template (data.chat_template_path=chatml) carries a trajectory token for token (a system "
            "message, an environment's user message)") in out.splitlines()
    assert "the run will start" in out


def test_dry_run_probes_tool_calls_in_the_recipes_format(capsys):
    """A tools recipe: the line names the call format and the tool messages; the embedded model's ChatML passes."""
    assert main(["train", str(ROOT / "recipes" / "tools_cpu.yaml"), "data.limit=8", "--dry-run"]) == 0
    assert ("checked: chat template (smollm2-135m-instruct) carries a trajectory token for token (a system message, "
            "tool calls (hermes) and tool messages)") in capsys.readouterr().out.splitlines()


def test_a_template_path_that_names_nothing_fails_the_dry_run_with_the_nearest_name(tmp_path, capsys):
    """Refused at preflight (every rlvr train, before a run folder), with the nearest shipped name, or the line of
    a Jinja syntax error."""
    from rlvr.recipe import load_recipe
    from rlvr.runtime.checks import preflight

    with pytest.raises(RecipeError, match="Did you mean 'chatml'"):
        preflight(load_recipe(TINY, ["data.chat_template_path=chatmll"]))
    assert main(["train", str(TINY), "data.chat_template_path=chatmll", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "data.chat_template_path='chatmll': no such file and not a template shipped in rlvr (chatml, mistral)" in err
    assert err.strip().endswith("Did you mean 'chatml'?")
    bad = tmp_path / "t.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content }")
    assert main(["train", str(TINY), f"data.chat_template_path={bad}", "--dry-run"]) == 2
    assert f"data.chat_template_path='{bad}': {bad} line 2 is not valid Jinja" in capsys.readouterr().err


def test_the_probe_has_a_system_message():
    """A template that drops the system message once a reply follows passed the old probe (no system message unless
    the tools listing needed one); the probe now opens with one."""
    tok = tokenizer(SYSTEM_IN_LAST_USER, "<s>", "<|im_end|>")
    why = _refused(tok)
    assert "renders the assistant's message after a different prefix than the generation prompt" in why
    assert "at probe turn 1, a final reply answered by an environment's user message" in why
    assert check_template(ChatRenderer(tok), [{"role": "user", "content": "q"}]) is None  # without one it extends


def test_the_probe_answers_a_tool_call_with_the_tool_runners_message_and_replies_again():
    """A template that refuses an assistant turn right after a tool message passed the old probe (user, reply,
    user); the probe now has two rounds of a call answered by its tool message. A template that needs a
    ``tool_call_id`` on tool messages (Mistral's, MISTRAL_IDS) passes: the probe's tool messages are the tool
    runner's own, which carries the ids such a template needs."""
    from tests.unit.tools_templates import MISTRAL_IDS

    tools = ToolsConfig(names=(f"{S}:add",))
    tok = tokenizer(ALTERNATING, "<s>", "<|im_end|>")
    assert check_template(ChatRenderer(tok, {"tools": []})) is None  # the old probe's conversation renders
    why = _refused(tok, environment=False, tools=tools)
    assert ("the template fails to render probe turn 2, a reply calling a tool, answered by its tool message: "
            "TemplateError: roles must alternate user/assistant") in why
    assert "tool calls and tool messages" in why and "tools.format hermes" in why
    renderer, listing = checked_renderer(tokenizer(MISTRAL_IDS, "<s>", "</s>"), DataConfig(), False,
                                         ToolsConfig(names=(f"{S}:add",), format="mistral"), "M")
    assert listing.call_ids and listing.fmt == "mistral"


# ----------------------------------------------------------------------------------------------------------------
# item 13: Mistral-layout templates and the mistral format


def test_the_mistral_layout_passes_for_a_tools_recipe_and_is_refused_with_an_environment():
    """Issue 38 item 13: the old probe answered the reply with a user message, which moves Mistral's tools listing
    (before the last user message), so every tools recipe was refused. Tools-only trajectories append tool
    messages: the layout extends them. With an environment its user messages do move the listing: refused, the
    difference shown, and the shipped ``mistral`` template (the listing before the first user message) passes."""
    tools = ToolsConfig(names=(f"{S}:add",), format="mistral")
    tok = tokenizer(MISTRAL, "<s>", "</s>")
    old = ChatRenderer(tok, {"tools": [{"name": "add"}]})
    assert "rewrites earlier turns" in check_template(old, tool_round=None, environment=True)  # the old probe
    renderer, listing = checked_renderer(tok, DataConfig(), False, tools, "M")
    assert listing.fmt == "mistral" and renderer.template_kwargs["tools"] == [listing.tools[0].schema]
    why = _refused(tokenizer(MISTRAL, "<s>", "</s>"), environment=True, tools=tools)
    assert "at probe turn 3, a final reply answered by an environment's user message" in why
    assert "(history is not a prefix of the longer rendering: at character 4, '<s>[AVAILABLE_TOOLS][{" in why
    assert "became '<s>[INST]What is 2 + 2?[/INST]" in why  # the listing moved to the new last user message
    checked_renderer(tokenizer(MISTRAL, "<s>", "</s>"), DataConfig(chat_template_path="mistral"), True, tools, "M")


def test_mistral_v3s_own_layout_is_refused_and_the_shipped_template_fixes_it():
    why = _refused(tokenizer(MISTRAL_V3, "<s>", "</s>"), environment=False,
                   tools=ToolsConfig(names=(f"{S}:add",), format="mistral"))
    assert "the template renders the assistant's message after a different prefix" in why  # the system message
    no_system = [{"role": "user", "content": "q"}]
    r = ChatRenderer(tokenizer(MISTRAL_V3, "<s>", "</s>"))
    assert "rewrites the assistant's message" in check_template(r, no_system)  # " " + content | trim
    r.tokenizer.chat_template = SHIPPED_MISTRAL
    assert check_template(r, no_system) is None


class AskOnce:
    """Asks "sure?" after the first reply without a call, ends after the second (reward 1)."""

    def reset(self, row):
        self.asked = False
        return None

    def step(self, history, reply):
        if self.asked:
            return EnvStep([], reward=1.0, done=True)
        self.asked = True
        return EnvStep([{"role": "user", "content": "sure?"}], reward=0.0, done=False)


class AddPool:
    """A tool pool that runs ``add`` in this process."""

    def run(self, calls, states=None):
        return [ToolResult(t.name, "ok", str(a["a"] + a["b"])) for t, a in calls]


class VllmLikeEngine:
    """Answers round r with ``script[r]`` then eos; the text leaves out the special tokens (``[TOOL_CALLS]``), as
    vLLM's and transformers' do (skip_special_tokens); the k-th token's logprob is -(k + 1) / 10."""

    def __init__(self, script: list[str]) -> None:
        self.script, self.calls = script, []

    def __call__(self, prompts: list[Prompt], sampling: SamplingConfig) -> list[Completion]:
        r = len(self.calls)
        self.calls.append([list(p.prompt_ids) for p in prompts])
        toks = ids(self.script[r]) + [VOCAB["</s>"]]
        return [Completion(prompt_index=p.index, sample_index=0, prompt_ids=list(p.prompt_ids), token_ids=toks,
                           logprobs=[-(k + 1) / 10 for k in range(len(toks))],
                           text=self.script[r].replace("[TOOL_CALLS]", ""), finish_reason="stop", policy_version=1)
                for p in prompts]  # fmt: skip


def test_a_mistral_tool_call_then_an_environment_turn_through_the_real_turn_loop_by_hand():
    """The shipped ``mistral`` template with tools and an environment: a call in the mistral format (its
    ``[TOOL_CALLS]`` sampled as a special token and missing from the engine's text, as vLLM gives it), the tool
    message with the id the template reads, an answer, the environment's "sure?", the answer again. Every id by
    hand; the engine was shown exactly the trajectory's ids each round."""
    tools = ToolsConfig(names=(f"{S}:add",), format="mistral")
    tok = tokenizer(MISTRAL, "<s>", "</s>")  # the model's own (refused with an environment): replaced by the key
    renderer, listing = checked_renderer(tok, DataConfig(chat_template_path="mistral"), True, tools, "M")
    runner = ToolRunner(listing.tools, tool_settings(tools, listing), AddPool(), InlineRunner())
    conv = [{"role": "user", "content": "what is 2+3?"}]
    calls = '[{"name": "add", "arguments": {"a": 2, "b": 3}}]'
    engine = VllmLikeEngine(["[TOOL_CALLS]" + calls, "5", "5"])
    start = Prompt(index=0, text="", prompt_ids=renderer.opening_ids(conv), gold="5")
    row = {"opening": conv, "gold": "5", "env": {"name": "tests/unit/test_chat_templates.py:AskOnce"}}
    (t,), _ = run_turns([start], [conv], 1, engine, runner, renderer,
                        TurnSettings(max_turns=4, max_tokens=4000, max_new_tokens=400),
                        SamplingConfig(n=1, max_new_tokens=400), [row])  # fmt: skip
    schema = json.dumps([listing.tools[0].schema])
    prompt = ids("<s>[AVAILABLE_TOOLS] " + schema + "[/AVAILABLE_TOOLS][INST] what is 2+3?[/INST]")
    cid = call_id(1, 0, json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}}))  # 1 message before the call
    eos = VOCAB["</s>"]
    first = ids("[TOOL_CALLS]" + calls) + [eos]
    between1 = ids('[TOOL_RESULTS] {"content": "5", "call_id": "' + cid + '"}[/TOOL_RESULTS]')
    between2 = ids("[INST] sure?[/INST]")
    assert start.prompt_ids == prompt and len(cid) == 9
    assert t.seq.ids == first + between1 + ids("5") + [eos] + between2 + ids("5") + [eos]
    assert t.seq.mask == [1] * len(first) + [0] * len(between1) + [1, 1] + [0] * len(between2) + [1, 1]
    assert engine.calls == [[prompt], [prompt + first + between1],
                            [prompt + first + between1 + ids("5") + [eos] + between2]]
    assert t.messages[2] == {"role": "tool", "name": "add", "content": "5", "tool_call_id": cid}
    assert (t.end, t.turns, t.turn_rewards) == ("done", 3, [None, 0.0, 1.0])


# ----------------------------------------------------------------------------------------------------------------
# data.chat_template_path: prompts, parsing, the saved policy


def test_the_key_renders_the_prompts_and_the_tools_listing(tmp_path):
    """build_prompts renders with the key's template (a file here: two lines by hand), and the tools listing is
    decided by it (chatml lists no ``tools``: the system message carries them, hermes)."""
    from rlvr.data import build_prompts
    from rlvr.tools.formats import recipe_tool_listing

    f = tmp_path / "mine.jinja"
    f.write_text("{%- for m in messages %}{{- m.role + ': ' + m.content + eos_token }}{%- endfor %}"
                 "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}")
    rows = [{"question": "hi", "gold": "1", "row": {"messages": [{"role": "user", "content": "hi"}]}},
            {"question": "what is 2+3?", "gold": "5", "row": {}}]
    tok = tokenizer(QWEN, "<s>", "<|im_end|>")
    (p, q), _ = build_prompts(rows, tok, DataConfig(chat_template_path=str(f), system_prompt="be brief"))
    assert p.text == "user: hi<|im_end|>assistant: "  # a row's own messages, as is
    assert q.text == "system: be brief<|im_end|>user: what is 2+3?<|im_end|>assistant: "
    assert q.prompt_ids == ids(q.text)
    tok = tokenizer(QWEN, "<s>", "<|im_end|>")  # QWEN lists tools itself; chatml does not
    listing = recipe_tool_listing(ToolsConfig(names=("calculator",)), DataConfig(chat_template_path="chatml"), tok)
    assert tok.chat_template == CHATML and listing.template_tools is None and listing.system and listing.fmt == "hermes"


def test_chatml_renders_turns_ended_by_eos_and_tool_results_as_qwen_does():
    tok = tokenizer(CHATML, "<s>", "<|im_end|>")
    conv = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
            {"role": "assistant", "content": "<think>r</think>c"}, {"role": "tool", "content": "1"},
            {"role": "tool", "content": "2"}, {"role": "user", "content": "u"}]
    assert tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>r</think>c"
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>"
        "<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n")
    llama = tokenizer(CHATML, "<s>", "<|eot_id|>")  # the turn end follows the tokenizer's eos
    assert llama.apply_chat_template(conv[1:3], tokenize=False) == ("<|im_start|>user\nq<|eot_id|>\n<|im_start|>"
                                                                    "assistant\n<think>r</think>c<|eot_id|>\n")


@pytest.mark.parametrize("fmt, text", [
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'),
    ("llama3", '{"name": "add", "parameters": {"a": 2, "b": 3}}'),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}]'),
])
def test_example_calls_are_written_as_each_format_teaches_and_parse_back(fmt, text):
    assert example_call("add", {"a": 2, "b": 3}, fmt) == text
    (c,) = parse_calls(text, fmt)
    assert (c.name, c.arguments, c.error) == ("add", {"a": 2, "b": 3}, None)


def test_a_mistral_call_list_without_its_special_token_is_read_as_calls():
    """vLLM's text leaves out ``[TOOL_CALLS]`` (a special token of Mistral's tokenizers): a reply that is only a
    JSON list of call objects and nothing else is read as calls; other replies starting with ``[`` are final
    answers."""
    a, b = parse_calls(' [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "f", "arguments": "{}"}]',
                       "mistral")
    assert (a.name, a.arguments, b.name, b.arguments) == ("add", {"a": 1, "b": 2}, "f", {})
    a, b = parse_calls('add{"a": 1, "b": 2} f {}', "mistral")  # the newer form, [TOOL_CALLS] and [ARGS] dropped
    assert (a.name, a.arguments, a.error, b.name, b.arguments) == ("add", {"a": 1, "b": 2}, None, "f", {})
    for answer in ("[1, 2] is the list", "[1, 2]", '[{"x": 1}]', "[not json", "[]", "The answer is 4.",
                   '[{"name": "add", "arguments": {}}] and then prose', 'add{"a": 1} and prose', "add{not json}",
                   'the set {"a": 1}', 'add[1]'):  # without the markers: only calls and nothing else
        assert parse_calls(answer, "mistral") == []


def test_the_saved_policy_carries_the_runs_template(tmp_path):
    """RUN/final (PolicyWorker.save_pretrained) holds the template the run rendered with, so rlvr eval and a
    server render the same."""
    from transformers import AutoTokenizer

    from rlvr.models import resolve_model
    from rlvr.recipe import load_recipe
    from rlvr.train.policy import PolicyWorker

    r = load_recipe(TINY, ["run.executor=local", "data.chat_template_path=chatml"])
    w = PolicyWorker(r, resolve_model("tiny-random"), 0, 1, "127.0.0.1", 0)
    out = w.save_pretrained(str(tmp_path / "final"))
    assert AutoTokenizer.from_pretrained(out).chat_template == CHATML


# ----------------------------------------------------------------------------------------------------------------
# published templates (tests/unit/real_templates/README.md)

REAL = Path(__file__).resolve().parent / "real_templates"


def test_qwen3s_own_template_carries_tool_calls_and_is_refused_with_an_environment():
    """Qwen3 drops the reasoning of the replies before the last user message: a tools-only trajectory (no user
    message after the first) keeps it and passes; an environment's user message strips it (refused); chatml fixes."""
    qwen3 = (REAL / "Qwen-Qwen3-0.6B.jinja").read_text()
    tools = ToolsConfig(names=(f"{S}:add",))
    _, listing = checked_renderer(tokenizer(qwen3, "<s>", "<|im_end|>"), DataConfig(), False, tools, "Qwen3")
    assert listing.fmt == "hermes" and listing.template_tools is not None
    why = _refused(tokenizer(qwen3, "<s>", "<|im_end|>"), environment=True, tools=tools)
    assert "rewrites earlier turns" in why and "at probe turn 3, a final reply answered by an environment's" in why
    assert "'sistant\\n<think>\\nFirst, 2 + 2 = 4.\\n</thin' became 'sistant\\n<tool_call>" in why
    checked_renderer(tokenizer(qwen3, "<s>", "<|im_end|>"), DataConfig(chat_template_path="chatml"), True, tools, "Q")


def test_mistral_nemos_own_template_is_refused_and_the_shipped_mistral_template_carries_it():
    """Mistral's published template folds the system message into the last user message only, and refuses a reply
    right after a tool message unless it carries ``tool_calls`` (rlvr renders a reply as sampled, a call included):
    refused with either reason; ``data.chat_template_path: mistral`` passes with tools and an environment."""
    nemo = (REAL / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text()
    tools = ToolsConfig(names=(f"{S}:add",), format="mistral")
    why = _refused(tokenizer(nemo, "<s>", "</s>"), environment=False, tools=tools)
    assert "renders the assistant's message after a different prefix than the generation prompt" in why
    r = ChatRenderer(tokenizer(nemo, "<s>", "</s>"))
    from rlvr.envs.template_check import list_tools, tool_round

    listing = list_tools(tools, r)
    assert listing.fmt == "mistral" and listing.call_ids  # read from the template: [TOOL_CALLS], tool_call_id
    assert check_template(r, [{"role": "user", "content": "q"}], tool_round(tools, listing), environment=False) == (
        "the template fails to render probe turn 2, a reply calling a tool, answered by its tool message: "
        "TemplateError: After the optional system message, conversation roles must alternate "
        "user/assistant/user/assistant/...")
    checked_renderer(tokenizer(nemo, "<s>", "</s>"), DataConfig(chat_template_path="mistral"), True, tools, "N")


def test_the_run_refuses_a_template_its_turns_would_refuse_before_starting_any_role():
    """The run's data loading (before Ray, engines or the trainer start) probes a multi-turn recipe's template as
    its turns would: Qwen3's own template with an environment is refused there, not after the engines are up."""
    from rlvr.config import RecipeError
    from rlvr.recipe import load_recipe
    from rlvr.runtime.controller import _load_data

    qwen3 = Path(__file__).parent / "real_templates" / "Qwen-Qwen3-0.6B.jinja"
    over = ["environment.name=guess", "environment.max_tokens=64"]
    with pytest.raises(RecipeError, match="data.chat_template_path"):
        _load_data(load_recipe("recipes/tiny_test.yaml", [*over, f"data.chat_template_path={qwen3}"]))
    assert _load_data(load_recipe("recipes/tiny_test.yaml", over)).prompts
