"""The verifiers 0.4.0 adapter (rlvr/envs/verifiers_env.py) on examples/verifiers_env/rlvr_vf_arith.py and small
tasksets written here: rows, scripted conversations with hand-worked rewards, multi-turn, a tool, a @stop, the turn
cap, pickling (and a fresh worker's cache) between steps, refused features, and environment errors ending the
trajectory as a failure (never a 0 reward)."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("verifiers")

from rlvr.envs import verifiers_env as ve  # noqa: E402
from rlvr.envs.runner import InlineRunner  # noqa: E402
from rlvr.envs.verifiers_env import VerifiersEnv, VerifiersRefused, VerifiersReplayError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ARITH = str(ROOT / "examples/verifiers_env/rlvr_vf_arith.py")
NAME = "rlvr.envs.verifiers_env:VerifiersEnv"


def say(text: str) -> dict:
    return {"role": "assistant", "content": text}


def hop(env: VerifiersEnv) -> VerifiersEnv:
    """The environment as a fresh worker gets it: pickled, and the per-process cache of loaded envs emptied."""
    blob = pickle.dumps(env)
    ve._LOADED.clear()
    return pickle.loads(blob)


def first_row(**args) -> dict:
    return VerifiersEnv.rows(size=3, seed=1, taskset=ARITH, taskset_args={"size": 10}, **args)[0]


# rlvr_vf_arith with size 10, seed 0: task 6 is 8 + 9 (c = 2); Random(1) shuffles it to the front.
ROW_Q = "What is 8 + 9? End your reply with the number."


def test_rows_carry_the_task_and_its_opening():
    rows = VerifiersEnv.rows(size=3, seed=1, taskset=ARITH, taskset_args={"size": 10})
    assert len(rows) == 3 and len({r["vf_task"]["id"] for r in rows}) == 3
    r = rows[0]
    assert r["question"] == ROW_Q and r["answer"] == "17"
    assert r["messages"] == [{"role": "user", "content": ROW_Q}]
    assert r["vf_task"]["info"] == {"a": 8, "b": 9, "c": 2, "followup": True}
    assert VerifiersEnv.rows(size=3, seed=1, taskset=ARITH, taskset_args={"size": 10}) == rows  # seeded
    assert [x["vf_task"]["id"] for x in VerifiersEnv.rows(size=3, seed=2, taskset=ARITH, taskset_args={"size": 10})] \
        != [x["vf_task"]["id"] for x in rows]
    with pytest.raises(ValueError, match="has 10 tasks; data.env_rows.size asks 11"):
        VerifiersEnv.rows(size=11, seed=1, taskset=ARITH, taskset_args={"size": 10})


@pytest.mark.parametrize("first, second, rewards", [
    ("8 + 9 = 17", "17 * 2 = 34", (0.5, 1.0)),     # both right: 0.5 + 0.5
    ("It is 16", "So 34", (0.0, 0.5)),             # the product of the true sum is right: 0.5
    ("17", "35", (0.5, 0.5)),                      # the sum only
    ("no idea", "none", (0.0, 0.0)),
])
def test_two_turns_scored_by_the_rubric(first, second, rewards):
    row = first_row()
    env = VerifiersEnv(ARITH, {"size": 10})
    assert env.reset(row) == [{"role": "user", "content": ROW_Q}]
    env = hop(env)
    s1 = env.step([], say(first))
    # the follow-up, with the score the trajectory would get ending here (sum_correct only)
    assert s1.messages == [{"role": "user", "content": "Now multiply your answer by 2. End your reply with the number."}]
    assert (s1.reward, s1.done, s1.info["vf_stop"]) == (rewards[0], False, "rlvr_ended")
    env = hop(env)
    s2 = env.step([], say(second))
    assert (s2.messages, s2.reward, s2.done) == ([], rewards[1], True)
    assert s2.info["vf_stop"] == "user_closed" and s2.info["vf_metrics"] == {"turns": 2.0}


def test_inline_runner_round_trip():
    row = {**first_row(), "env": {"name": NAME, "args": {"taskset": ARITH, "taskset_args": {"size": 10}}}}
    runner = InlineRunner()
    [(state, opening)] = runner.reset([row])
    assert opening == [{"role": "user", "content": ROW_Q}]
    [(state, s1)] = runner.step([(state, opening, say("17"))])
    [(state, s2)] = runner.step([(state, opening, say("34"))])
    assert (s1.reward, s2.reward, s2.done) == (0.5, 1.0, True)


def test_turn_cap_ends_and_scores():
    env = VerifiersEnv(ARITH, {"size": 10}, max_turns=1)
    env.reset(first_row())
    s = env.step([], say("17"))  # the cap is reached: run()'s follow-up turn comes back terminated
    assert (s.messages, s.reward, s.done, s.info["vf_stop"]) == ([], 0.5, True, "max_turns")


def test_turn_cap_inside_a_tool_loop_ends_the_segment():
    args = {"size": 10, "task": {"tools": True}}
    env = VerifiersEnv(ARITH, args, max_turns=1)
    env.reset(VerifiersEnv.rows(size=1, seed=1, taskset=ARITH, taskset_args=args)[0])
    s = env.step([], say('<tool_call>{"name": "calculator_multiply", "arguments": {"x": 8, "y": 9}}</tool_call>'))
    assert (s.messages, s.reward, s.done, s.info["vf_stop"]) == ([], 0.0, True, "max_turns")


def test_stop_hook_ends_before_the_next_model_call():
    env = VerifiersEnv(ARITH, {"size": 10})
    env.reset(first_row())
    s = env.step([], say("I give up"))
    assert (s.messages, s.reward, s.done, s.info["vf_stop"]) == ([], 0.0, True, "gave_up")


def test_single_turn_taskset_without_env_and_reward_range():
    env = VerifiersEnv(ARITH, {"size": 10, "followup": False}, reward_range=[0.0, 2.0])
    row = VerifiersEnv.rows(size=1, seed=1, taskset=ARITH, taskset_args={"size": 10, "followup": False})[0]
    env.reset(row)
    s = env.step([], say("17"))  # followup off: sum_correct weighs 1.0 -> Trace.reward 1.0 -> 1.0 / 2 on [0, 2]
    assert (s.reward, s.done) == (0.5, True)


def test_tool_call_answered_in_process():
    args = {"size": 10, "task": {"tools": True}}
    row = VerifiersEnv.rows(size=1, seed=1, taskset=ARITH, taskset_args=args)[0]
    env = VerifiersEnv(ARITH, args)
    opening = env.reset(row)
    schema = ('{"type": "function", "function": {"name": "calculator_multiply", "description": "Multiply two integers.", '
              '"parameters": {"properties": {"x": {"title": "X", "type": "integer"}, "y": {"title": "Y", "type": '
              '"integer"}}, "required": ["x", "y"], "type": "object"}}}')
    assert opening[0]["role"] == "system" and f"<tools>\n{schema}\n</tools>" in opening[0]["content"]
    assert opening[1] == {"role": "user", "content": ROW_Q}
    call = '<tool_call>\n{"name": "calculator_multiply", "arguments": {"x": 6, "y": 7}}\n</tool_call>'
    env = hop(env)
    s = env.step([], say(call))
    assert s.messages == [{"role": "tool", "content": "42", "tool_call_id": "call_0_0_0", "name": "calculator_multiply"}]
    assert (s.done, s.reward) == (False, 0.0)  # no answer yet
    s = env.step([], say('<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
                         '<tool_call>{"name": "calculator_multiply", "arguments": {"x": "a"}}</tool_call>'))
    assert s.messages[0]["content"] == "error: unknown tool 'nope'; the tools: calculator_multiply"
    assert s.messages[1]["content"].startswith("error: ValidationError")
    s = env.step([], say("17"))  # a reply without calls ends the segment: run() asks its follow-up
    assert (s.reward, s.done) == (0.5, False) and "multiply your answer by 2" in s.messages[0]["content"]
    s = hop(env).step([], say("34"))
    assert (s.reward, s.done, s.info["vf_metrics"]) == (1.0, True, {"turns": 4.0})


TASKSET = '''
import verifiers.v1 as vf
__all__ = ["T"{extra_all}]
class D(vf.TaskData):
    answer: str = "1"
class K(vf.Task[D, vf.State, vf.TaskConfig]):
    {needs}
    @vf.reward
    async def right(self, trace) -> float:
        return float(trace.last_reply == self.data.answer){reward_extra}
class T(vf.Taskset[K, vf.TasksetConfig]):
    def load(self):
        yield K(D(prompt="say 1"), self.config.task)
'''


def module(tmp_path: Path, name: str, extra_all: str = "", needs: str = "pass", reward_extra: str = "",
           tail: str = "") -> str:
    src = TASKSET.format(extra_all=extra_all, needs=needs, reward_extra=reward_extra) + textwrap.dedent(tail)
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    return str(path)


def play(path: str, *replies: str, **args):
    row = VerifiersEnv.rows(size=1, seed=0, taskset=path, **args)[0]
    env = VerifiersEnv(path, **args)
    env.reset(row)
    return [env.step([], say(r)) for r in replies]


ENV_TAIL = '''
class C(vf.EnvConfig):
    me: vf.AgentConfig = vf.AgentConfig()
class E(vf.Env[C]):
    async def run(self, task, agents):
        async with agents.me.interaction(task) as it:
            seg = await it.turn()
            {body}
'''


def test_env_error_is_a_failure_not_a_zero(tmp_path):
    path = module(tmp_path, "vfa_raises", ', "E"',
                  tail=ENV_TAIL.format(body='raise RuntimeError("game engine broke on " + seg.last_reply)'))
    with pytest.raises(RuntimeError, match="game engine broke on 1"):
        play(path, "1")
    row = {**VerifiersEnv.rows(size=1, seed=0, taskset=path)[0], "env": {"name": NAME, "args": {"taskset": path}}}
    runner = InlineRunner()
    [(state, opening)] = runner.reset([row])
    [(state2, why)] = runner.step([(state, opening, say("1"))])
    assert state2 is None and why.startswith("error: RuntimeError: game engine broke on 1")


def test_reward_error_and_out_of_range(tmp_path):
    path = module(tmp_path, "vfa_badreward", reward_extra="\n    @vf.reward(weight=2.0)\n    async def bonus(self) "
                  "-> float:\n        return 1.0")
    with pytest.raises(ValueError, match="verifiers reward 3 .* outside reward_range \\[0, 1\\]"):
        play(path, "1")
    [s] = play(path, "1", reward_range=[0, 3])  # SingleAgentEnv: agents.agent.run(task), one segment
    assert (s.reward, s.done, s.info["vf_stop"]) == (1.0, True, "agent_completed")  # 1*1 + 2*1 = 3 -> 3/3
    assert play(path, "2", reward_range=[0, 3])[0].reward == pytest.approx(2 / 3)
    path = module(tmp_path, "vfa_rewardraises", reward_extra="\n    @vf.reward\n    async def boom(self) -> float:"
                  "\n        raise KeyError('no gold')")
    with pytest.raises(Exception, match="scoring: KeyError"):
        play(path, "1")


def test_nondeterministic_run_is_refused_on_replay(tmp_path):
    path = module(tmp_path, "vfa_random", ', "E"', tail=ENV_TAIL.format(
        body='import uuid\n            await it.turn(uuid.uuid4().hex)\n            await it.turn("again")'))
    with pytest.raises(VerifiersReplayError, match="at turn 1 on replay"):
        play(path, "a", "b")


TWO_SEATS = '''
class C(vf.EnvConfig):
    me: vf.AgentConfig = vf.AgentConfig()
    user: vf.AgentConfig = vf.AgentConfig()
class E(vf.Env[C]):
    async def run(self, task, agents):
        pass
'''


@pytest.mark.parametrize("name, kwargs, match", [
    ("vfr_judge", {"taskset_args": {"task": {"judges": [{"id": "reference"}]}}}, "plugged judges"),
    ("vfr_container", {"needs": "NEEDS_CONTAINER = True"}, "container task"),
    ("vfr_setup", {"needs": "async def setup(self, trace, runtime):\n        pass"}, r"K.setup\(\)"),
    ("vfr_runtime", {"reward_extra": "\n    @vf.reward\n    async def tests(self, runtime) -> float:\n        "
                                     "return 1.0"}, r"tests\(runtime\)"),
    ("vfr_seats", {"extra_all": ', "E"', "tail": TWO_SEATS}, "agent seats"),
    ("vfr_harness", {"taskset_args": None, "env_args": {"agent": {"harness": {"id": "bash"}}}}, "harness 'bash'"),
    ("vfr_send", {"extra_all": ', "E"', "tail": ENV_TAIL.format(body='await it.send("hi")')}, "send/steer"),
    ("vfr_intercept", {"needs": "@vf.intercept\n    async def rewrite(self, request: vf.Request):\n        return None"},
     "@vf.intercept"),
    ("vfr_remote", {"needs": "@classmethod\n    def toolsets(cls, config):\n        return [R(vf.ToolsetConfig("
                             "url='http://tools:8000'))]", "tail": "class R(vf.Toolset[vf.ToolsetConfig, vf.State]):\n"
                             "    pass\n"}, "remote server or container runtime"),
])
def test_refused_features_name_themselves(tmp_path, name, kwargs, match):
    kwargs = dict(kwargs)
    targs, eargs = kwargs.pop("taskset_args", None), kwargs.pop("env_args", None)
    path = module(tmp_path, name, **kwargs)
    with pytest.raises(VerifiersRefused, match=match) as e:
        play(path, "1", taskset_args=targs, env_args=eargs)
    assert "Supported:" in str(e.value)


def test_builtin_multi_agent_env_refused():
    with pytest.raises(VerifiersRefused, match="built-in env 'user-sim'"):
        VerifiersEnv.rows(size=1, seed=0, taskset=ARITH, env="user-sim")


def test_check_args_and_row_without_task():
    with pytest.raises(ValueError, match="reward_range"):
        VerifiersEnv.check_args(taskset=ARITH, reward_range=[1, 1])
    with pytest.raises(ValueError, match="environment.args.taskset"):
        VerifiersEnv.check_args(taskset="")
    with pytest.raises(VerifiersRefused, match="built-in env 'best-of-n'"):
        VerifiersEnv.check_args(taskset=ARITH, env="best-of-n")
    with pytest.raises(ValueError, match="tool_format"):
        VerifiersEnv.check_args(taskset=ARITH, tool_format="xml")
    with pytest.raises(ValueError, match="max_turns"):
        VerifiersEnv.check_args(taskset=ARITH, max_turns=0)
    with pytest.raises(VerifiersRefused, match="plugged judges"):  # rlvr's preflight loads the environment
        VerifiersEnv.check_args(taskset=ARITH, taskset_args={"size": 10, "task": {"judges": [{"id": "reference"}]}})
    VerifiersEnv.check_args(taskset=ARITH, taskset_args={"size": 10})
    with pytest.raises(KeyError, match="no vf_task"):
        VerifiersEnv(ARITH).reset({"question": "q"})
    with pytest.raises(KeyError, match="no vf_task"):
        VerifiersEnv(ARITH).reset({"vf_task": first_row()["vf_task"]})
    with pytest.raises(ValueError, match=r"the row was made by .*\{\"size\": 10\}.* and this environment is"):
        VerifiersEnv(ARITH, {"size": 10, "task": {"tools": True}}).reset(first_row())


def test_installed_verifiers_found_under_rlvr_s_own_folder():
    # run from the repository root, where ./verifiers (rlvr_verifiers) shadows the distribution's name
    code = "import rlvr.envs.verifiers_env as m; vf = m.import_vf(); print(vf.Taskset.__module__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "verifiers.v1.taskset"


STATEFUL = '''
import verifiers.v1 as vf
__all__ = ["T", "E"]
class S(vf.State):
    calls: int = 0
class D(vf.TaskData):
    pass
class TC(vf.ToolsetConfig):
    pass
class Counter(vf.Toolset[TC, S]):
    TOOL_PREFIX = None
    @vf.tool
    def bump(self, by: int = 1) -> str:
        """Count a call."""
        self.state.calls += by
        return f"calls={self.state.calls}"
class K(vf.Task[D, S, vf.TaskConfig]):
    @vf.reward
    async def calls(self, trace) -> float:
        return trace.state.calls / 10
    @vf.metric
    async def msgs(self, trace) -> float:  # the branch walked through the nodes' parent links
        return float(len(trace.messages))
    @vf.metric
    async def first(self, trace) -> float:  # the first reply's text without its call, and the call
        m = trace.assistant_messages[0]
        return float(m.content == "Let me count." and (m.tool_calls[0].name, m.tool_calls[0].arguments)
                     == ("bump", '{"by": 2}'))
    @classmethod
    def toolsets(cls, config):
        return [Counter(TC())]
class T(vf.Taskset[K, vf.TasksetConfig]):
    def load(self):
        yield K(D(prompt="count"), self.config.task)
class C(vf.EnvConfig):
    me: vf.AgentConfig = vf.AgentConfig()
class E(vf.Env[C]):
    async def run(self, task, agents):
        async with agents.me.interaction(task) as it:
            try:  # a run() that catches Exception must not swallow rlvr's suspension
                await it.turn()
                await it.turn("more")
            except Exception:
                raise AssertionError("unreachable")
    async def finalize(self, task, episode):  # cross-trace judgement: one more weighted reward
        episode.traces[0].record_reward("closing", 1.0, 0.1)
'''


def test_tool_state_travels_between_steps_and_reaches_scoring(tmp_path):
    path = tmp_path / "vfa_stateful.py"
    path.write_text(STATEFUL)
    row = VerifiersEnv.rows(size=1, seed=0, taskset=str(path))[0]
    env = VerifiersEnv(str(path))
    env.reset(row)
    env = hop(env)
    s = env.step([], say('Let me count. <tool_call>{"name": "bump", "arguments": {"by": 2}}</tool_call>'))
    assert s.messages[0]["content"] == "calls=2" and s.reward == pytest.approx(0.2 + 0.1)  # calls/10 + closing
    env = hop(env)
    s = env.step([], say('<tool_call>{"name": "bump", "arguments": {}}</tool_call>'))
    assert s.messages[0]["content"] == "calls=3"
    s = env.step([], say("done"))
    assert (s.messages, s.reward) == ([{"role": "user", "content": "more"}], pytest.approx(0.3 + 0.1))
    s = hop(env).step([], say("ok"))
    assert (s.reward, s.done, s.info["vf_rewards"]) == (pytest.approx(0.4), True, {"calls": 0.3, "closing": 1.0})
    # system (the tool listing), count, call, result, call, result, done, more, ok
    assert s.info["vf_metrics"] == {"msgs": 9.0, "first": 1.0} and s.info["vf_stop"] == "user_closed"


def test_reward_range_below_zero_the_seat_s_own_cap_and_a_module_name(monkeypatch):
    # reward_range [-1, 1]: Trace.reward r -> (r + 1) / 2
    env = VerifiersEnv(ARITH, {"size": 10}, reward_range=[-1, 1])
    env.reset(first_row())
    assert env.step([], say("17")).reward == pytest.approx(0.75)  # 0.5
    assert env.step([], say("1")).reward == pytest.approx(0.75)   # still 0.5: the product is wrong
    # the seat's max_turns (1) under the adapter's (3): the lower cap ends it after the first reply
    env = VerifiersEnv(ARITH, {"size": 10}, env_args={"solver": {"max_turns": 1}}, max_turns=3)
    env.reset(first_row())
    s = env.step([], say("17"))
    assert (s.done, s.info["vf_stop"], s.reward) == (True, "max_turns", 0.5)
    # an installed module by name (here: its folder on sys.path) is the same taskset as its file
    monkeypatch.syspath_prepend(str(ROOT / "examples/verifiers_env"))
    by_name = VerifiersEnv.rows(size=3, seed=1, taskset="rlvr_vf_arith", taskset_args={"size": 10})
    assert [r["vf_task"] for r in by_name] == [r["vf_task"] for r in VerifiersEnv.rows(
        size=3, seed=1, taskset=ARITH, taskset_args={"size": 10})]


OPENER = '''
import verifiers.v1 as vf
__all__ = ["T", "E"]
class D(vf.TaskData):
    pass
class K(vf.Task[D, vf.State, vf.TaskConfig]):
    @vf.reward
    async def turns(self, trace) -> float:
        return trace.num_turns / 10
class T(vf.Taskset[K, vf.TasksetConfig]):
    def load(self):
        yield K(D(system_prompt="Be brief."), self.config.task)  # no prompt: run() opens
class C(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
class E(vf.Env[C]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as it:
            seg = await it.turn([vf.UserMessage(content="hello")])
            while not seg.terminated:  # a game loop: it ends on the turn cap's terminated segment
                seg = await it.turn("again")
'''


@pytest.mark.timeout(60)
def test_env_opens_the_conversation_and_loops_to_the_cap(tmp_path):
    path = tmp_path / "vfa_opener.py"
    path.write_text(OPENER)
    [row] = VerifiersEnv.rows(size=1, seed=0, taskset=str(path))
    assert (row["question"], row["answer"]) == ("hello", "")
    assert row["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    env = VerifiersEnv(str(path), max_turns=3)
    assert env.reset(row) == row["messages"]
    steps = [env.step([], say(f"r{i}")) for i in range(3)]
    again = [{"role": "user", "content": "again"}]
    assert [(s.messages, s.reward, s.done) for s in steps[:2]] == [(again, 0.1, False), (again, 0.2, False)]
    assert (steps[2].reward, steps[2].done, steps[2].info["vf_stop"]) == (pytest.approx(0.3), True, "max_turns")
