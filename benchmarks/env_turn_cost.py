"""What each environment adapter costs per turn, against a plain rlvr environment (issue 42).

Each adapter plays B trajectories for K turns through the real environment pool (:class:`rlvr.envs.pool.EnvPool`,
2 workers, as training runs them; no engine: the replies are fixed), and the wall time of each round (one
``pool.step`` over the B live trajectories, which is what the engines wait for in the turn loop) is measured:

- ``plain``: tests/unit/conformance_envs.py's ``PlainEnv`` (answers "again": the pool's own cost, pickling the
  state both ways, the pipe);
- ``textarena``: Rock-Paper-Scissors with 1000 rounds against ``always:[rock]`` (the game engine's step, the
  observation formatting, the generator state kept);
- ``openenv_http``: the conformance suite's OpenEnv HTTP server in this process (a connection and a request per step);
- ``openenv_ws``: its WebSocket server in this process (one connection per trajectory, pinned to its worker);
- ``verifiers``: the conformance suite's verifiers 0.4.0 taskset (tests/unit/conformance_vf.py: its ``Env.run``
  answers "again"), replayed from the start at each step, so its cost grows with the turns so far.

Prints per adapter the median round (ms, B trajectories), the median per trajectory-turn (round / B) and the ratio
to ``plain`` measured in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/env_turn_cost.py [--trajectories 16] [--turns 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlvr.envs.pool import EnvPool  # noqa: E402

HERE = "tests/unit/conformance_envs.py"


def adapters(server_url: str, ws_url: str) -> dict[str, tuple[dict, dict, str]]:
    """name -> (environment entry, row fields, the fixed reply)."""
    from rlvr.envs.verifiers_env import VerifiersEnv

    vf_args = {"taskset": "tests/unit/conformance_vf.py", "taskset_args": {"mode": "ok"}, "reward_range": [0, 1]}
    return {
        "plain": ({"name": f"{HERE}:PlainEnv", "args": {}}, {}, "3"),
        "textarena": ({"name": "textarena", "args": {"game": "IteratedRockPaperScissors-v0",
                                                     "game_args": {"num_rounds": 1000}, "players": 2,
                                                     "opponent": "always:[rock]"}}, {"seed": 1}, "[paper]"),
        "openenv_http": ({"name": "openenv", "args": {"url": server_url, "observation_field": "text"}}, {}, "3"),
        "openenv_ws": ({"name": "openenv_ws", "args": {"url": ws_url, "observation_field": "text"}}, {}, "3"),
        "verifiers": ({"name": "verifiers", "args": vf_args}, VerifiersEnv.rows(size=1, seed=0, **vf_args)[0], "3"),
    }


def rounds(pool: EnvPool, env: dict, fields: dict, reply: str, b: int, k: int) -> list[float]:
    """Seconds of each of ``k`` step rounds over ``b`` trajectories (after their reset)."""
    out = pool.reset([{"gold": "7", "env": env, **fields} for _ in range(b)])
    states = [s for s, _ in out]
    if any(s is None for s in states):
        raise RuntimeError(f"reset failed: {next(o for s, o in out if s is None)}")
    times = []
    history = [{"role": "user", "content": "play"}]
    for _ in range(k):
        t = time.perf_counter()
        res = pool.step([(s, history, {"role": "assistant", "content": reply}) for s in states])
        times.append(time.perf_counter() - t)
        states = [s for s, _ in res]
        if any(s is None for s in states):
            raise RuntimeError(f"step failed: {next(o for s, o in res if s is None)}")
    pool.release(states)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=16)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from tests.unit.conformance_envs import OpenEnvServer, OpenEnvWsServer

    server, ws_server = OpenEnvServer(), OpenEnvWsServer()
    table = adapters(server.url, ws_server.url)
    medians: dict[str, float] = {}
    from rlvr.envs.pool import env_preload

    with EnvPool(2, 30.0, preload=env_preload(["textarena", "verifiers"])) as pool:
        rounds(pool, *table["plain"], 4, 2)  # warm the workers' imports
        rounds(pool, *table["textarena"], 4, 2)
        for name, (env, fields, reply) in table.items():
            times = [t for _ in range(args.repeats) for t in rounds(pool, env, fields, reply, args.trajectories,
                                                                      args.turns)]  # fmt: skip
            medians[name] = statistics.median(times)
    server.stop()
    ws_server.stop()
    b = args.trajectories
    print(f"{b} trajectories, {args.turns} turns, {args.repeats} repeats, 2 environment workers")
    print(f"{'adapter':<14} {'round ms':>9} {'ms/turn':>8} {'vs plain':>9}")
    for name, m in medians.items():
        print(f"{name:<14} {m * 1e3:9.1f} {m * 1e3 / b:8.2f} {m / medians['plain']:8.2f}x")


if __name__ == "__main__":
    main()
