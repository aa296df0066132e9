"""What a tool call costs in the turn loop beyond the tool itself (issue 26).

Per call: the time from the reply's parse to the call's result back in the engine's input, i.e. one round's
:meth:`rlvr.tools.runner.ToolRunner.step` (parse the reply, check the arguments against the schema, run the call in
the :class:`~rlvr.tools.execute.ToolPool`'s worker processes, build the ``tool`` message) plus
:meth:`rlvr.envs.tokens.ChatRenderer.between` (the ids between the turns, rendered with the model's chat
template): what the turn loop does between two engine calls. Against the bare sandbox call, measured in the same
run: the tool function called directly in this process (``calculator``: the arithmetic itself; ``python``: the
``code`` verifier's sandbox running the code, a fresh interpreter in its namespaces, which is the floor any
``python`` tool pays), before this process imports torch (a bigger process forks slower).

At 1 call (one trajectory) and at 8 in one round (8 trajectories with one call each: the turn loop sends a round's
calls to the pool together; ``--workers`` processes run them in parallel). Per configuration the median over
``--repeats`` rounds of the round's wall time, per call (wall / calls) and its ratio to the bare call's median.

    .venv/bin/python benchmarks/tool_overhead.py            # ~1 min on 2 cores

Measured 2026-12-05 on a 2-core machine shared with other test runs (load ~8), median of 10 rounds, 8 tool workers,
with every call isolated (docs/tools_isolation.md; ns-root: a process forked per call, killed with its tree after):

    tool        calls/round  round ms  per call ms  bare call ms  added ms/call  per call / bare
    calculator            1      5.88         5.88         0.011           5.87           515.03
    calculator            8     29.48         3.68         0.011           3.67           322.62
    python                1     32.25        32.25        28.420           3.83             1.13
    python                8    148.58        18.57        28.420          -9.85             0.65

The loop adds ~4-6 ms a call (two pipe hops, worker to tool server to the call's own process, the fork of that
process and the kill and reap of its tree, the JSON parse, the schema check, the template rendering of the ids
between turns; it was ~0.6 ms on 2026-12-03 before calls were isolated): hundreds of times a bare arithmetic,
little beside a sandboxed interpreter (+4 ms, 1.13x); 8 calls in one round overlap in the workers (0.65x of a bare
call each, on 2 cores). Against a turn's sampling (seconds on CPU) either is noise: in recipes/tools_cpu.yaml's run
(before the isolation) the calls were 0.1% of the rollout's time.
"""

from __future__ import annotations

import argparse
import statistics
import time

CALCULATOR = "123456789 * 987654321 + (17 + 25) * 3"
PYTHON = "print(sum(i * i for i in range(1000)))"
EXPECTED = {"calculator": str(123456789 * 987654321 + (17 + 25) * 3), "python": str(sum(i * i for i in range(1000)))}


def bare(tool: str, repeats: int) -> list[float]:
    """Seconds of each direct call (no worker process, no parsing, no message)."""
    from rlvr.tools.builtins import calculator, python

    out = []
    for k in range(repeats + 1):  # the first warms up (imports, page cache) and is not counted
        t0 = time.perf_counter()
        value = calculator(CALCULATOR) if tool == "calculator" else python(PYTHON)
        if k:
            out.append(time.perf_counter() - t0)
        assert value.strip() == EXPECTED[tool], value
    return out


def in_loop(tool: str, calls: int, repeats: int, workers: int) -> list[float]:
    """Seconds of each round of ``calls`` trajectories with one call each: runner.step + the ids between turns."""
    import json

    from transformers import AutoTokenizer

    from rlvr.config import ToolsConfig
    from rlvr.envs.rollout import list_tools, tool_runner
    from rlvr.envs.tokens import ChatRenderer
    from rlvr.models import resolve_model

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct")))
    cfg = ToolsConfig(names=(tool,), format="hermes", num_workers=workers, timeout_s=10.0)
    runner = tool_runner(cfg, list_tools(cfg, renderer), None)
    args = {"expression": CALCULATOR} if tool == "calculator" else {"code": PYTHON}
    reply = {"role": "assistant", "content": "<tool_call>\n" + json.dumps({"name": tool, "arguments": args}) +
             "\n</tool_call>"}  # fmt: skip
    opening = [{"role": "user", "content": "What is 123456789 times 987654321?"}]
    try:
        runner.step([(s, opening, reply) for s, _ in runner.reset([{"opening": opening}] * workers)])  # warm workers
        out = []
        for _ in range(repeats):
            states = [s for s, _ in runner.reset([{"opening": opening}] * calls)]
            t0 = time.perf_counter()
            steps = runner.step([(s, opening, reply) for s in states])
            for _, step in steps:
                renderer.between(opening, reply["content"], True, step.messages)
            out.append(time.perf_counter() - t0)
            assert [m["content"].strip() for _, st in steps for m in st.messages] == [EXPECTED[tool]] * calls, steps
        return out
    finally:
        runner.pool.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--workers", type=int, default=8, help="tool worker processes (tools.num_workers)")
    a = ap.parse_args()
    print(f"tool call overhead: median of {a.repeats} rounds, {a.workers} tool workers")
    print(f"{'tool':<11} {'calls/round':>11} {'round ms':>9} {'per call ms':>12} {'bare call ms':>13} "
          f"{'added ms/call':>14} {'per call / bare':>16}")
    # the bare calls first, while this process is as small as a tool worker (after torch and transformers are
    # imported, the sandbox's fork of this process costs ~15 ms more)
    bares = {tool: statistics.median(bare(tool, a.repeats)) for tool in ("calculator", "python")}
    for tool, b in bares.items():
        for calls in (1, 8):
            r = statistics.median(in_loop(tool, calls, a.repeats, a.workers))
            print(f"{tool:<11} {calls:>11} {1e3 * r:>9.2f} {1e3 * r / calls:>12.2f} {1e3 * b:>13.3f} "
                  f"{1e3 * (r / calls - b):>14.2f} {r / calls / b:>16.2f}")


if __name__ == "__main__":
    main()
