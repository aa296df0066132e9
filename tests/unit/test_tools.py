"""Tool use through the real turn loop (rlvr.envs.turns.run_turns): a scripted engine (fixed replies), the tool
environment (rlvr.tools.runner.ToolRunner) on a real tool pool (worker processes), and character-level tokenizers
carrying the chat templates of three call formats (tests/unit/tools_templates.py), so every id is worked out by hand:
one id per character, one per special marker."""

from __future__ import annotations

import json
import time

import pytest

from rlvr.envs.tokens import ChatRenderer
from rlvr.envs.turns import TurnSettings, run_turns
from rlvr.tools.execute import ToolPool
from rlvr.tools.registry import resolve_tools
from rlvr.tools.runner import ToolRunner, ToolSettings
from rlvr.types import Completion, Prompt, SamplingConfig
from tests.unit.tools_templates import LLAMA, MISTRAL, QWEN, VOCAB, ids, tokenizer

S = "tests/unit/tools_sample.py"
NAMES = ["calculator", "python", f"{S}:add", f"{S}:sleep_forever", f"{S}:flood", f"{S}:fetch", f"{S}:garbage",
         f"{S}:die"]
TIMEOUT_S, CAP = 1.0, 60
ADD_SCHEMA = ('{"type": "function", "function": {"name": "add", "description": "Add two whole numbers.", '
              '"parameters": {"type": "object", "properties": {"a": {"type": "integer", "description": "The first '
              'number."}, "b": {"type": "integer", "description": "The second number."}}, "required": ["a", "b"]}, '
              '"return": {"type": "integer"}}}')


@pytest.fixture(scope="module")
def tools():
    return resolve_tools(NAMES)


@pytest.fixture(scope="module")
def pool(tools):
    with ToolPool(tools, num_workers=3, timeout_s=TIMEOUT_S, max_output_chars=CAP, memory_mb=1024) as p:
        yield p


@pytest.fixture(scope="module")
def roomy_pool(tools):
    """For the python tool, whose sandbox starts an interpreter per call: under load (a training run beside the
    tests) that took over ``TIMEOUT_S`` = 1 s and the call was stopped; 1 s is for the hung-tool test."""
    with ToolPool(tools, num_workers=1, timeout_s=20.0, max_output_chars=CAP, memory_mb=1024) as p:
        yield p


class ScriptedEngine:
    """Answers round r with ``script[r]`` (then eos) for every prompt; the k-th token's logprob is -(k + 1) / 10."""

    def __init__(self, script: list[str], eos: int) -> None:
        self.script, self.eos, self.calls = script, eos, []

    def __call__(self, prompts: list[Prompt], sampling: SamplingConfig) -> list[Completion]:
        r = len(self.calls)
        self.calls.append([list(p.prompt_ids) for p in prompts])
        toks = ids(self.script[r]) + [self.eos]
        return [Completion(prompt_index=p.index, sample_index=0, prompt_ids=list(p.prompt_ids), token_ids=toks,
                           logprobs=[-(k + 1) / 10 for k in range(len(toks))], text=self.script[r],
                           finish_reason="stop", policy_version=3) for p in prompts]  # fmt: skip


def _run(template, bos, eos, fmt, script, pool, tools, only=None, question="what is 2+3?", g=1):
    tok = tokenizer(template, bos, eos)
    chosen = [t for t in tools if only is None or t.name in only]
    renderer = ChatRenderer(tok, {"tools": [t.schema for t in chosen]})
    runner = ToolRunner(chosen, ToolSettings(fmt=fmt, max_calls_per_turn=4), pool)
    conv = [{"role": "user", "content": question}]
    start = Prompt(index=0, text="", prompt_ids=[0], gold="5")
    engine = ScriptedEngine(script, VOCAB[eos])
    trajs, counters = run_turns([start], [conv], g, engine, runner, renderer,
                                TurnSettings(max_turns=4, max_tokens=4000, max_new_tokens=400),
                                SamplingConfig(n=g, max_new_tokens=400), [{"opening": conv}])  # fmt: skip
    return trajs, runner, engine, renderer


def _check_two_turns(t, engine, prompt, call, between, answer, eos_id):
    first = ids(call) + [eos_id]
    assert t.seq.prompt_ids == prompt
    assert t.seq.ids == first + between + ids(answer) + [eos_id]
    assert t.seq.mask == [1] * len(first) + [0] * len(between) + [1] * (len(answer) + 1)
    assert t.seq.logprobs == [-(k + 1) / 10 for k in range(len(first))] + [0.0] * len(between) + \
        [-(k + 1) / 10 for k in range(len(answer) + 1)]
    assert engine.calls == [[prompt], [prompt + first + between]]  # token-in: the engine saw exactly these ids
    assert (t.end, t.turns, t.last_text) == ("done", 2, answer)


def test_hermes_call_on_qwen_template(pool, tools):
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    (t,), runner, engine, renderer = _run(QWEN, "<s>", "<|im_end|>", "hermes", [call, "5"], pool, tools, {"add"})
    prompt = ids("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools"
                 "\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
                 "function signatures within <tools></tools> XML tags:\n<tools>\n" + ADD_SCHEMA + "\n</tools>\n\n"
                 "For each function call, return a json object with function name and arguments within "
                 "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                 "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nwhat is 2+3?<|im_end|>\n"
                 "<|im_start|>assistant\n")
    between = ids("\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    _check_two_turns(t, engine, prompt, call, between, "5", VOCAB["<|im_end|>"])
    assert t.messages[2] == {"role": "tool", "name": "add", "content": "5"}
    assert t.info[0]["tool_calls"] == [{"name": "add", "call": "<tool_call>\n" + call[12:-13] + "\n</tool_call>",
                                        "status": "ok", "result": "5"}]
    # the whole conversation rendered at once gives the same ids (the last turn's closing "\n" was never sampled)
    assert prompt + t.seq.ids == renderer.encode(renderer.render(t.messages, generation_prompt=False))[:-1]
    assert runner.counters()["add/ok"] == 1 and runner.counters()["calls"] == 1


def test_llama3_json_call(pool, tools):
    call = '{"name": "add", "parameters": {"a": 2, "b": 3}}'
    (t,), _, engine, _ = _run(LLAMA, "<|begin_of_text|>", "<|eot_id|>", "llama3", [call, "5"], pool, tools, {"add"})
    prompt = ids("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, respond "
                 "with a JSON for a function call with its proper arguments.\n\n" + ADD_SCHEMA + "\n\nwhat is 2+3?"
                 "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    between = ids("<|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|><|start_header_id|>assistant"
                  "<|end_header_id|>\n\n")
    _check_two_turns(t, engine, prompt, call, between, "5", VOCAB["<|eot_id|>"])


def test_mistral_parallel_calls_answered_in_order(pool, tools):
    call = ('[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "calculator", "arguments": '
            '{"expression": "7*6"}}]')
    (t,), runner, engine, _ = _run(MISTRAL, "<s>", "</s>", "mistral", [call, "42"], pool, tools, {"add", "calculator"})
    schemas = json.dumps([t_.schema for t_ in tools if t_.name in ("calculator", "add")])
    prompt = ids("<s>[AVAILABLE_TOOLS]" + schemas + "[/AVAILABLE_TOOLS][INST]what is 2+3?[/INST]")
    between = ids("[TOOL_RESULTS]5[/TOOL_RESULTS][TOOL_RESULTS]42[/TOOL_RESULTS]")
    _check_two_turns(t, engine, prompt, call, between, "42", VOCAB["</s>"])
    assert [m["name"] for m in t.messages[2:4]] == ["add", "calculator"]


def test_a_hung_tool_costs_its_limit_and_the_trajectory_goes_on(pool, tools):
    call = "".join(f'<tool_call>{{"name": "{n}", "arguments": {a}}}</tool_call>' for n, a in
                   [("sleep_forever", '{"seconds": 1e9}'), ("add", '{"a": 1, "b": 1}'),
                    ("sleep_forever", '{"seconds": 5}')])
    t0 = time.perf_counter()
    trajs, runner, _, _ = _run(QWEN, "<s>", "<|im_end|>", "hermes", [call, "2"], pool, tools)
    took = time.perf_counter() - t0
    # the 3 calls ran at once on the 3 workers (one after another: 2 s); a replaced worker's start is not waited for.
    # (More hung calls than workers take a second wave: the pool's size bounds the parallelism.)
    assert took < TIMEOUT_S + 0.5, took
    for t in trajs:
        assert t.end == "done" and [m["content"] for m in t.messages[2:5]] == [
            "error: sleep_forever did not finish within 1 s and was stopped", "2",
            "error: sleep_forever did not finish within 1 s and was stopped"]
    c = runner.counters()
    assert (c["sleep_forever/timeout"], c["add/ok"], c["calls"], c["trajectories"]) == (2, 1, 3, 1)


def _one_call(pool, tools, name, args):
    call = f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'
    (t,), runner, _, _ = _run(QWEN, "<s>", "<|im_end|>", "hermes", [call, "ok"], pool, tools)
    assert t.end == "done" and t.messages[2]["role"] == "tool"
    return t.messages[2]["content"], runner.counters()


def test_a_flood_of_output_is_capped_with_the_count_cut(pool, tools):
    text, c = _one_call(pool, tools, "flood", {"n": 1_000_000})
    # printed: 1,000,000 "x" + "\n", returned: "end" -> 1,000,004 characters; the first 60 kept
    assert text == "x" * 60 + "... [999944 characters cut]" and c["flood/ok"] == 1


def test_the_network_is_refused(pool, roomy_pool, tools):
    text, c = _one_call(pool, tools, "fetch", {"url": "example.com"})
    assert text == "error: PermissionError: network access is disabled for tools" and c["fetch/error"] == 1
    # the python tool's sandbox: a network namespace with no route (ns-* modes) or the audit hook (plain modes)
    text, _ = _one_call(roomy_pool, tools, "python", {"code": "import socket\nsocket.create_connection(('1.1.1.1', 80))"})
    assert text.startswith(("line 2: OSError: [Errno 101] Network is", "line 2: PermissionError")), text


def test_garbage_a_crash_and_python_errors_become_messages(pool, roomy_pool, tools):
    text, c = _one_call(pool, tools, "garbage", {"x": 1})
    assert text == "error: TypeError: the tool returned a object, not text or a JSON value" and c["garbage/error"] == 1
    text, c = _one_call(pool, tools, "die", {"x": 1})
    assert text == "error: die crashed: its process died (over 1024 MiB of memory?)" and c["die/crashed"] == 1
    text, c = _one_call(roomy_pool, tools, "python", {"code": "print(6 * 7)\n1 / 0"})
    assert text == "42\nline 2: ZeroDivisionError: division by zero\n" and c["python/ok"] == 1
    text, _ = _one_call(pool, tools, "calculator", {"expression": "123456789 * 987654321"})
    assert text == "121932631112635269"


def test_malformed_calls_are_answered_with_what_was_wrong(pool, tools):
    bad_json = '{"name": "add", "arguments": {"a": 2,}}'
    reply = (f"<tool_call>{bad_json}</tool_call>"
             '<tool_call>{"name": "mul", "arguments": {}}</tool_call>'
             '<tool_call>{"name": "add", "arguments": {"a": "2", "b": 3}}</tool_call>'
             '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
             '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
             '<tool_call>{"name": "add"')
    (t,), runner, _, _ = _run(QWEN, "<s>", "<|im_end|>", "hermes", [reply, "5"], pool, tools, {"add"})
    assert t.end == "done"
    assert [m["content"] for m in t.messages[2:8]] == [
        "error: the <tool_call> block is not valid JSON (Expecting property name enclosed in double quotes at "
        f"character {bad_json.index(',}') + 1}): {bad_json}",
        "error: unknown tool 'mul'; the tools are: add",
        "error: the argument 'a' of add must be of type integer, got '2'",
        "error: add needs the argument 'b'",
        "error: not run: at most 4 tool calls per reply (tools.max_calls_per_turn)",
        "error: the <tool_call> block is not closed with </tool_call>",
    ]
    c = runner.counters()
    assert (c["calls"], c["malformed"], c.get("add/ok", 0)) == (6, 6, 0)


def test_the_recipe_section_and_the_rollout_metrics():
    from rlvr.config import ToolsConfig, _convert
    from rlvr.envs.rollout import tool_metrics
    from rlvr.metrics import names as mn

    cfg = _convert(["calculator", "python"], ToolsConfig, "tools")  # the list is short for names
    assert cfg.names == ("calculator", "python") and cfg.enabled and cfg.format == "auto"
    assert not ToolsConfig().enabled
    before = {"trajectories": 4.0, "calls": 2.0, "malformed": 0.0, "seconds": 1.0, "add/ok": 2.0}
    after = {"trajectories": 8.0, "calls": 8.0, "malformed": 2.0, "seconds": 1.5, "add/ok": 5.0, "add/timeout": 1.0}
    m = tool_metrics(before, after, total_s=2.0)
    # 6 calls over 4 trajectories; 2 of 6 malformed; 0.5 s of tools in a 2 s turn loop
    assert m[mn.TOOLS_CALLS_PER_TRAJ] == 1.5 and m[mn.TOOLS_MALFORMED_FRAC] == pytest.approx(1 / 3)
    assert m[mn.TOOLS_TIME_FRAC] == 0.25 and m["tools/add/ok"] == 3.0 and m["tools/add/timeout"] == 1.0
    assert mn.describe("tools/add/timeout").pattern == mn.TOOL_OUTCOME
    # every tool's outcomes are counted from the start (0 until one happens: the keys do not appear later)
    from rlvr.tools.runner import ToolRunner, ToolSettings

    counters = ToolRunner(resolve_tools(["calculator"]), ToolSettings(fmt="hermes"), pool=None).counters()
    assert {k: v for k, v in counters.items() if k.startswith("calculator/")} == {
        "calculator/ok": 0.0, "calculator/error": 0.0, "calculator/timeout": 0.0, "calculator/crashed": 0.0}
    # a recipe's list override sets the names and keeps the section's other settings
    from rlvr.recipe import load_recipe

    r = load_recipe("recipes/tools_cpu.yaml", ["tools=[python]"])
    assert (r.tools.names, r.tools.format, r.tools.timeout_s) == (("python",), "hermes", 5.0)
    assert load_recipe("recipes/tiny_test.yaml", ["tools=[python]"]).tools.names == ("python",)


def test_a_template_without_tools_gets_them_in_a_system_message(tools):
    from transformers import AutoTokenizer

    from rlvr.envs.rollout import list_tools, tool_runner
    from rlvr.models import resolve_model
    from rlvr.tools.formats import describe_tools
    from rlvr.tools.runner import ToolState

    from rlvr.config import ToolsConfig

    r = ChatRenderer(AutoTokenizer.from_pretrained(resolve_model("tiny-random")))
    cfg = ToolsConfig(names=("calculator",), num_workers=1)
    runner = tool_runner(cfg, list_tools(cfg, r), None)
    try:
        assert "tools" not in r.template_kwargs and runner.settings.fmt == "hermes"
        conv = [{"role": "user", "content": "2+2"}]
        (state, opening), = runner.reset([{"opening": conv}])
        text = describe_tools([tools[0].schema], "hermes")
        assert state == ToolState("tools", {}) and opening == [{"role": "system", "content": text}] + conv
        # a reply without a call ends the trajectory (no environment)
        (_, step), = runner.step([(state, conv, {"role": "assistant", "content": "4"})])
        assert step.done and step.messages == []
    finally:
        runner.pool.close()
