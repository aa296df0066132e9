"""Stateful tools (rlvr.tools.registry: a class whose methods are the tools) through the real turn loop: one instance
per trajectory, kept pickled between calls, closed exactly once however the trajectory ends. Also the Mistral call
ids carried to tool messages, the template probe with the tools listed, and the prompt-length check counting them.

The sample classes are written into tmp_path (tools_stateful.py there): each ``close()`` writes one marker file
``<instance id>-<random>`` holding the instance's total into a folder it opens with ``access(write=...)`` (tools are
isolated: a write outside a call's own folder is refused otherwise), so the tests count closes per instance and see
which state was closed. Every value below is worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path
import textwrap

import pytest

from rlvr.envs.tokens import ChatRenderer
from rlvr.envs.turns import TurnSettings, run_turns
from rlvr.tools.execute import ToolPool
from rlvr.tools.registry import resolve_tools
from rlvr.tools.runner import ToolRunner, ToolSettings
from rlvr.types import Prompt, SamplingConfig
from tests.unit.test_tools import ScriptedEngine
from tests.unit.tools_templates import MISTRAL, MISTRAL_IDS, QWEN, VOCAB, ids, tokenizer

TIMEOUT_S = 4.0  # the python tool gets about half (its subprocess start took > 0.5 s on a loaded 2-core machine)

SAMPLE = '''
"""Stateful tools for the tests (imported by the tool servers: the standard library and rlvr only)."""
import os
import threading
import time
import uuid

from rlvr.tools.registry import access

CLOSED = {closed!r}


@access(write=[CLOSED])  # its close() writes a marker there: outside its call's folder, so it must say so
class Counter:
    """A running total."""

    def __init__(self):
        self.total = 0
        self.id = uuid.uuid4().hex[:8]

    def add(self, n: int) -> str:
        """Add n to the running total and return the total.

        Args:
            n: The number to add.
        """
        self.total += n
        return str(self.total)

    def hang(self, n: int) -> str:
        """Add n, then never return (for the timeout test).

        Args:
            n: The number to add.
        """
        self.total += n
        while True:
            time.sleep(1)

    def crash(self, n: int) -> str:
        """Add n, then kill the worker (for the crash test).

        Args:
            n: The number to add.
        """
        self.total += n
        os._exit(1)

    def spoil(self, n: int) -> str:
        """Add n and keep a generator (the instance no longer pickles).

        Args:
            n: The number to add.
        """
        self.total += n
        self.gen = (i for i in range(3))
        return str(self.total)

    def close(self):
        with open(os.path.join(CLOSED, self.id + "-" + uuid.uuid4().hex[:8]), "w") as f:
            f.write(str(self.total))


class Locked:
    """An instance that never pickles."""

    def __init__(self):
        self.lock = threading.Lock()

    def poke(self) -> str:
        """Poke it."""
        return "poked"


class BadClose:
    """A close() that raises."""

    def touch(self) -> str:
        """Touch it."""
        return "touched"

    def close(self):
        raise RuntimeError("cannot let go")
'''


@pytest.fixture(scope="module")
def closed_folder():
    """Where Counter.close() writes its markers: a folder of the system's temporary folder open to everyone (as
    root, tools run as nobody, who must reach it: pytest's own folders are closed to others)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="rlvr-closed-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def sample(tmp_path_factory, closed_folder):
    root = tmp_path_factory.mktemp("stateful")
    (root / "tools_stateful.py").write_text(textwrap.dedent(SAMPLE.format(closed=str(closed_folder))))
    return root


@pytest.fixture(scope="module")
def tools(sample):
    f = sample / "tools_stateful.py"
    return resolve_tools([f"{f}:Counter", f"{f}:Locked", f"{f}:BadClose", "python_session", "files"])


@pytest.fixture(scope="module")
def pool(tools):
    with ToolPool(tools, num_workers=3, timeout_s=TIMEOUT_S, max_output_chars=200, memory_mb=1024) as p:
        yield p


@pytest.fixture
def closed(closed_folder):
    """The markers of the closes of one test: {instance id: [its total at each close]}."""
    folder = closed_folder
    for f in folder.iterdir():
        f.unlink()

    def read() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for f in sorted(folder.iterdir()):
            out.setdefault(f.name.split("-")[0], []).append(f.read_text())
        return out

    return read


def _call(name: str, **args) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


class RaisingEngine(ScriptedEngine):
    """A :class:`ScriptedEngine` whose script may hold an exception: that round raises it (a rollout failing)."""

    def __call__(self, prompts, sampling):
        if isinstance(self.script[len(self.calls)], BaseException):
            raise self.script[len(self.calls)]
        return super().__call__(prompts, sampling)


def _run(pool, tools, script, g=1, max_turns=6):
    renderer = ChatRenderer(tokenizer(QWEN, "<s>", "<|im_end|>"), {"tools": [t.schema for t in tools]})
    runner = ToolRunner(tools, ToolSettings(fmt="hermes"), pool)
    conv = [{"role": "user", "content": "count"}]
    start = Prompt(index=0, text="", prompt_ids=[0], gold="5")
    engine = RaisingEngine(script, VOCAB["<|im_end|>"])
    trajs, _ = run_turns([start], [conv], g, engine, runner, renderer,
                         TurnSettings(max_turns=max_turns, max_tokens=20000, max_new_tokens=400),
                         SamplingConfig(n=g, max_new_tokens=400), [{"opening": conv}])  # fmt: skip
    return trajs, runner


def _results(t) -> list[str]:
    return [m["content"] for m in t.messages if m["role"] == "tool"]


def test_a_class_gives_one_tool_per_public_method(tools):
    by_owner = {}
    for t in tools:
        by_owner.setdefault(t.owner, []).append((t.name, t.closes))
    # close() and _private names are not tools; the schema of the bound method has no `self`
    assert by_owner == {"Counter": [("add", True), ("hang", True), ("crash", True), ("spoil", True)],
                        "Locked": [("poke", False)], "BadClose": [("touch", True)],
                        "PythonSession": [("python", False)],
                        "Files": [("write_file", False), ("read_file", False), ("list_files", False)]}
    add = next(t for t in tools if t.name == "add")
    assert add.parameters == {"type": "object", "properties": {"n": {"type": "integer",
                                                                     "description": "The number to add."}},
                              "required": ["n"]}


def test_state_persists_within_a_trajectory_and_is_separate_between_trajectories(pool, tools, closed):
    trajs, runner = _run(pool, tools, [_call("add", n=2), _call("add", n=3), "done"], g=2)
    # each trajectory: 0 + 2 = 2, then 2 + 3 = 5 (a shared instance would give 2, 4, then 7, 9)
    assert [(_results(t), t.end) for t in trajs] == [(["2", "5"], "done")] * 2
    assert sorted(closed().values()) == [["5"], ["5"]]  # two instances, each closed once, holding 5
    c = runner.counters()
    assert (c["Counter/created"], c["Counter/closed"], c["add/ok"]) == (2, 2, 4)


def test_calls_of_one_reply_to_one_instance_run_in_order(pool, tools, closed):
    (t,), _ = _run(pool, tools, [_call("add", n=2) + _call("add", n=3) + _call("add", n=4), "done"])
    assert _results(t) == ["2", "5", "9"] and list(closed().values()) == [["9"]]


def test_closed_once_at_max_turns(pool, tools, closed):
    # turn 2 reaches max_turns: its call is never run, the trajectory ends holding 2
    (t,), _ = _run(pool, tools, [_call("add", n=2), _call("add", n=3)], max_turns=2)
    assert (t.end, _results(t)) == ("max_turns", ["2"]) and list(closed().values()) == [["2"]]


def test_a_timeout_keeps_the_state_before_it_and_still_closes(pool, tools, closed):
    (t,), runner = _run(pool, tools, [_call("add", n=2), _call("hang", n=5), _call("add", n=1), "done"])
    # hang's +5 died with its worker: 2, the timeout, then 2 + 1 = 3
    assert _results(t) == ["2", f"error: hang did not finish within {TIMEOUT_S:g} s and was stopped", "3"]
    assert t.end == "done" and list(closed().values()) == [["3"]]
    assert runner.counters()["hang/timeout"] == 1


def test_a_worker_crash_keeps_the_state_before_it_and_still_closes(pool, tools, closed):
    (t,), _ = _run(pool, tools, [_call("add", n=2), _call("crash", n=5), "done"])
    assert _results(t) == ["2", "error: crash crashed: its process died (over 1024 MiB of memory?)"]
    assert list(closed().values()) == [["2"]]


def test_a_rollout_that_raises_mid_way_still_closes(pool, tools, closed):
    with pytest.raises(RuntimeError, match="engine lost"):
        _run(pool, tools, [_call("add", n=2), RuntimeError("engine lost")], g=2)
    assert sorted(closed().values()) == [["2"], ["2"]]


def test_an_instance_that_does_not_pickle_is_an_error_for_the_model(pool, tools, closed):
    (t,), runner = _run(pool, tools, [_call("poke") + _call("add", n=2), _call("spoil", n=5) + _call("add", n=1),
                                      "done"])
    must = ("a stateful tool's state must pickle (it is kept with the trajectory, pickled, between calls): keep only "
            "picklable values (numbers, text, lists, dicts...) in its attributes")
    assert _results(t) == [
        "error: poke could not start: the Locked instance does not pickle (TypeError: cannot pickle "
        f"'_thread.lock' object); {must}",
        "2",
        # spoil's +5 is not kept (its instance did not pickle back): 2 + 1 = 3
        f"error: TypeError: the Counter instance does not pickle (TypeError: cannot pickle 'generator' object); {must}",
        "3",
    ]
    assert list(closed().values()) == [["3"]]
    c = runner.counters()
    assert (c["Locked/create_error"], c["poke/error"], c["spoil/error"], c["Counter/closed"]) == (1, 1, 1, 1)


def test_a_failing_close_is_counted_not_raised(pool, tools, closed):
    (t,), runner = _run(pool, tools, [_call("touch"), "done"])
    assert (t.end, _results(t)) == ("done", ["touched"])
    assert runner.counters()["BadClose/close_error"] == 1 and "BadClose/closed" not in runner.counters()


def test_python_session_keeps_variables_between_calls(pool, tools):
    (t,), _ = _run(pool, tools, [_call("python", code="x = 21\nprint('set')"), _call("python", code="1 / 0"),
                                 _call("python", code="print(x * 2)"), "done"])
    # the failing call is not kept: the third call replays only the first (silently) and prints 42
    assert _results(t) == ["set\n", "line 1: ZeroDivisionError: division by zero\n", "42\n"]


def test_files_keep_what_was_written(pool, tools):
    (t,), _ = _run(pool, tools, [_call("write_file", path="a.txt", content="hello"),
                                 _call("read_file", path="a.txt") + _call("list_files") + _call("read_file", path="b"),
                                 "done"])  # fmt: skip
    assert _results(t) == ["wrote 5 characters to a.txt", "hello", "a.txt (5 characters)",
                           "error: FileNotFoundError: no file 'b'; the files: a.txt"]


# --- Mistral call ids ------------------------------------------------------------------------------------------------


def test_mistral_call_ids_reach_the_tool_messages():
    from rlvr.tools.formats import tool_listing

    listing = tool_listing(["tests/unit/tools_sample.py:add"], "auto", MISTRAL_IDS)
    assert listing.call_ids and not tool_listing(["tests/unit/tools_sample.py:add"], "auto", MISTRAL).call_ids
    renderer = ChatRenderer(tokenizer(MISTRAL_IDS, "<s>", "</s>"), listing.template_kwargs())
    conv = [{"role": "user", "content": "2+3?"}]
    given = '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "abc123XYZ"}]'
    missing = '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "add", "arguments": {"a": 1, ' \
              '"b": 1}, "id": "short"}]'
    with ToolPool(listing.tools, num_workers=1, timeout_s=5.0, max_output_chars=200) as pool:
        runner = ToolRunner(listing.tools, ToolSettings(fmt="mistral", call_ids=listing.call_ids), pool)
        for reply, want in [(given, ["abc123XYZ"]),
                            # none given, or not 9 alphanumerics: sha256("1:<k>:<the call's JSON>")[:9], k its position
                            (missing, ["7c512034e", "c9af1501b"])]:
            engine = ScriptedEngine([reply, "5"], VOCAB["</s>"])
            (t,), _ = run_turns([Prompt(index=0, text="", prompt_ids=[0], gold="5")], [conv], 1, engine, runner,
                                renderer, TurnSettings(max_turns=4, max_tokens=4000, max_new_tokens=400),
                                SamplingConfig(n=1, max_new_tokens=400), [{"opening": conv}])  # fmt: skip
            assert t.end == "done" and [m["tool_call_id"] for m in t.messages[2:-1]] == want
            results = "".join(f'[TOOL_RESULTS]{{"content": {r}, "call_id": "{i}"}}[/TOOL_RESULTS]'
                              for r, i in zip(["5", "2"], want))
            assert t.seq.ids == ids(reply) + [VOCAB["</s>"]] + ids(results) + ids("5") + [VOCAB["</s>"]]


def test_a_parsed_call_keeps_its_id():
    from rlvr.tools.formats import parse_calls

    (a,) = parse_calls('[TOOL_CALLS][{"name": "f", "arguments": {}, "id": "abc123XYZ"}]', "mistral")
    (b,) = parse_calls('[TOOL_CALLS]f[CALL_ID]xyz987ABC[ARGS]{"x": 1}', "mistral")
    (c,) = parse_calls('<tool_call>{"name": "f", "arguments": {}}</tool_call>', "hermes")
    assert (a.id, b.id, b.arguments, c.id) == ("abc123XYZ", "xyz987ABC", {"x": 1}, None)


# --- the template probe and the prompt-length check see the tools ----------------------------------------------------

# QWEN, but with tools listed it renders earlier assistant turns without their <think> block (Qwen3-style)
STRIPS_WITH_TOOLS = QWEN.replace(
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}",
    "{%- set c = message.content %}{%- if tools and message.role == 'assistant' and not loop.last %}"
    "{%- set c = c.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + c + '<|im_end|>' + '\\n' }}")


def test_the_template_probe_runs_with_the_tools_listed(tmp_path):
    from rlvr.config import DataConfig, EnvironmentConfig, ToolsConfig
    from rlvr.envs.rollout import TurnRollouts
    from rlvr.envs.tokens import check_template

    assert STRIPS_WITH_TOOLS != QWEN
    tok = tokenizer(STRIPS_WITH_TOOLS, "<s>", "<|im_end|>")
    assert check_template(ChatRenderer(tok)) is None  # without tools it extends the conversation
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="rewrites earlier turns"):
        turns = TurnRollouts(EnvironmentConfig(), DataConfig(source="x"), 64, str(tmp_path),
                             ToolsConfig(names=("calculator",), num_workers=1))
        turns.close()


def test_the_prompt_length_check_counts_the_tools_listing():
    from rlvr.config import DataConfig
    from rlvr.data.datasets import build_prompts
    from rlvr.tools.formats import tool_listing

    rows = [{"question": "2+3?", "gold": "5", "row": {}}]
    bare = "{%- for m in messages %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}"
    for template in (QWEN, bare):  # the tools rendered by the template (tools=), then as a system message
        tok = tokenizer(template, "<s>", "<|im_end|>")
        plain = ChatRenderer(tok).opening_ids([{"role": "user", "content": "2+3?"}])
        listing = tool_listing(["calculator"], "auto", template)
        with_tools = ChatRenderer(tok, listing.template_kwargs()).opening_ids(
            listing.opening([{"role": "user", "content": "2+3?"}]))
        assert len(with_tools) > len(plain) + 100  # the schema is long
        cfg = DataConfig(source="x", max_prompt_tokens=len(with_tools) - 1)
        (p,), _ = build_prompts(rows, tok, cfg)  # without the tools it fits
        assert p.prompt_ids == plain
        with pytest.raises(ValueError, match=f"longer than data.max_prompt_tokens={len(with_tools) - 1}"):
            build_prompts(rows, tok, cfg, tools=listing)
        (p,), _ = build_prompts(rows, tok, DataConfig(source="x", max_prompt_tokens=len(with_tools)), tools=listing)
        assert p.prompt_ids == with_tools  # the first prompt a trajectory with tools starts from
        with pytest.raises(ValueError, match=r"the questions, the tools listing \(fewer tools in tools.names"):
            build_prompts(rows, tok, cfg, context=(len(with_tools) - 1, 8), tools=listing)  # no room: the fix names it


def test_the_system_listing_for_a_template_without_tools():
    from rlvr.tools.formats import describe_tools, tool_listing

    bare = "{%- for m in messages %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}"
    listing = tool_listing(["calculator"], "auto", bare)
    assert listing.template_tools is None and listing.fmt == "hermes"
    text = describe_tools([listing.tools[0].schema], "hermes")
    assert listing.opening([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}]) == [
        {"role": "system", "content": "Be brief.\n\n" + text}, {"role": "user", "content": "q"}]
    assert listing.opening([{"role": "user", "content": "q"}]) == [{"role": "system", "content": text},
                                                                  {"role": "user", "content": "q"}]


def test_load_prompts_counts_the_tools_as_the_first_turn_renders_them():
    """The run's own prompt load (rlvr.runtime.checks.load_prompts) filters by the prompt a trajectory with tools
    starts from: the ids equal the renderer's rendering of ToolRunner.reset's opening (QWEN lists the tools itself;
    the bare template gets them as a system message)."""
    from rlvr.config import ToolsConfig
    from rlvr.envs.rollout import list_tools
    from rlvr.recipe import load_recipe
    from rlvr.runtime.checks import load_prompts
    from rlvr.tools.runner import ToolRunner

    tiny = Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml"
    bare = "{%- for m in messages %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}"
    for template in (QWEN, bare):
        tok = tokenizer(template, "<s>", "<|im_end|>")
        plain, _ = load_prompts(load_recipe(tiny, ["data.max_prompt_tokens=2000"]), tok, None)
        recipe = load_recipe(tiny, ["data.max_prompt_tokens=2000", "tools.names=[calculator]"])
        prompts, _ = load_prompts(recipe, tok, None)
        renderer = ChatRenderer(tok)
        listing = list_tools(ToolsConfig(names=("calculator",)), renderer)
        runner = ToolRunner(listing.tools, ToolSettings(fmt=listing.fmt, system=listing.system), pool=None)
        (_, opening), = runner.reset([{"opening": [{"role": "user", "content": prompts[0].question}]}])
        assert prompts[0].prompt_ids == renderer.opening_ids(opening)
        assert len(prompts[0].prompt_ids) > len(plain[0].prompt_ids) + 100  # the calculator's schema and how-to


def test_eval_counts_the_tools_listing_in_its_prompts(tmp_path):
    """rlvr eval --tools: a set's prompts are the first prompts its trajectories carry, listing included (the engine's
    context is sized from them: without it a few-shot opening plus the listing overran vLLM's max_model_len)."""
    from rlvr.config import ModelConfig, ToolsConfig
    from rlvr.evaluate import EvalConfig, EvalSet, load_set
    from rlvr.tools.formats import tool_listing

    data = tmp_path / "q.jsonl"
    opening = [{"role": "user", "content": "2+3?"}]  # the row's own opening: rendered as is
    data.write_text(json.dumps({"question": "2+3?", "answer": "5", "messages": opening}) + "\n")
    tok = tokenizer(QWEN, "<s>", "<|im_end|>")
    es = EvalSet(name="q", source=str(data))
    listing = tool_listing(["calculator"], "auto", QWEN)
    want = ChatRenderer(tok, listing.template_kwargs()).opening_ids(listing.opening(opening))
    plain = ChatRenderer(tok).opening_ids(opening)
    base = EvalConfig(model=ModelConfig(path="m"), data=(str(data),))
    with_tools = EvalConfig(model=ModelConfig(path="m"), data=(str(data),), tools=ToolsConfig(names=("calculator",)))
    assert load_set(es, base, tok, 4096).prompts[0].prompt_ids == plain
    assert load_set(es, with_tools, tok, 4096).prompts[0].prompt_ids == want and len(want) > len(plain) + 100
