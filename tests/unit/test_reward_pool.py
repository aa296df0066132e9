"""ScoringPool and RewardWorker: hard time limits, crashes, errors, order (case V14), weights.

The verifiers the workers run are the functions and classes below, named in ``file.py:attr`` form (the
workers import this file). Each pool here starts in well under a second (forkserver).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from rlvr.config import VerifierSpec
from rlvr.reward import RewardWorker, Scored, ScoringPool, UnknownVerifierError, reward_metrics
from rlvr.types import VerifyResult

HERE = os.path.abspath(__file__)


def misbehave(response: str, gold: str, **row: object) -> float:
    """1.0 for response == gold; hangs on "hang", kills its process on "die", raises on "raise"."""
    if response == "hang":
        time.sleep(3600)
    if response == "die":
        os._exit(3)
    if response == "raise":
        raise ValueError(f"bad input {gold}")
    if response == "hog":
        _ = bytearray(4 * 2**30)  # 4 GiB
    if response.startswith("die_once:"):  # a worker lost once (the OOM killer, a kill from outside), then fine
        marker = response.split(":", 1)[1]
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(9)
        return float(gold == "right")
    return float(response == gold)


def uses_row(response: str, gold: str, **row: object) -> VerifyResult:
    """Score = the row's ``bonus``; parsed = the sorted row keys (to see what the worker passed on)."""
    return VerifyResult(score=float(row.get("bonus", 0.0)), parsed=",".join(sorted(row)))


class Length:
    """Score 1 when the response is at most ``max_chars`` long."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars

    def verify(self, response: str, gold: str, **row: object) -> VerifyResult:
        ok = len(response) <= self.max_chars
        return VerifyResult(score=float(ok), reason=None if ok else "too_long")


class BrokenInit:
    def __init__(self) -> None:
        raise RuntimeError("no such model file")

    def verify(self, response: str, gold: str, **row: object) -> VerifyResult:
        return VerifyResult(score=1.0)


def spec(attr: str, weight: float = 1.0, **args: object) -> VerifierSpec:
    return VerifierSpec(name=f"{HERE}:{attr}", weight=weight, args=dict(args))


def reasons(out: list[Scored], key: str) -> list[str | None]:
    return [s.results[key].reason for s in out]


def test_timeout_is_killed_and_next_samples_scored() -> None:
    timeout = 1.0
    with ScoringPool([spec("misbehave")], num_workers=1, timeout_s=timeout) as pool:
        t0 = time.monotonic()
        out = pool.score(["hang", "4", "5"], ["4", "4", "6"], [{}, {}, {}])
        elapsed = time.monotonic() - t0
        key = pool.keys[0]
        assert [s.reward for s in out] == [0.0, 1.0, 0.0]
        assert reasons(out, key) == ["timeout", None, "wrong"]
        assert timeout <= out[0].latency_s <= timeout + 1.0
        # one worker: samples 2 and 3 waited for the replacement, which starts in well under a second here
        assert elapsed < timeout + 5.0
        assert pool.stats() == {"samples": 3, "timeouts": 1, "crashes": 0, "errors": 0, "restarts": 1, "rescored": 0}
        # the replacement keeps serving
        assert [s.reward for s in pool.score(["7"], ["7"], [{}])] == [1.0]


def test_crash_is_replaced() -> None:
    # "die" kills every worker it meets: scored once more on a fresh worker (issue 41), which it kills too, so it
    # is the answer's doing: 0, reason crashed
    with ScoringPool([spec("misbehave")], num_workers=1, timeout_s=5.0) as pool:
        out = pool.score(["1", "die", "2"], ["1", "1", "2"], [{}, {}, {}])
        assert [s.reward for s in out] == [1.0, 0.0, 1.0]
        assert reasons(out, pool.keys[0]) == [None, "crashed", None]
        assert [s.rescored for s in out] == [False, False, False]
        assert pool.stats() == {"samples": 4, "timeouts": 0, "crashes": 2, "errors": 0, "restarts": 2, "rescored": 0}


def test_a_worker_lost_once_is_not_the_policys_zero(tmp_path) -> None:
    # the worker dies under the sample once (the machine's fault, not the answer's): a fresh worker scores it and
    # that score stands; "right" scores 1 (so a 0 here could only come from the lost worker)
    m1, m2 = tmp_path / "a", tmp_path / "b"
    with ScoringPool([spec("misbehave")], num_workers=2, timeout_s=5.0) as pool:
        out = pool.score([f"die_once:{m1}", "x", f"die_once:{m2}"], ["right", "x", "wrong"], [{}] * 3)
        assert [s.reward for s in out] == [1.0, 1.0, 0.0]
        assert reasons(out, pool.keys[0]) == [None, None, "wrong"]  # a real verdict, not "crashed"
        assert [s.rescored for s in out] == [True, False, True]
        assert pool.stats() == {"samples": 5, "timeouts": 0, "crashes": 2, "errors": 0, "restarts": 2, "rescored": 2}
        m = reward_metrics(out)
        assert m["reward/rescored_frac"] == 2 / 3 and m["reward/crash_frac"] == 0.0


def test_raise_scores_error_and_worker_lives_on() -> None:
    with ScoringPool([spec("misbehave")], num_workers=1, timeout_s=5.0) as pool:
        out = pool.score(["raise", "3"], ["7", "3"], [{}, {}])
        assert out[0].results[pool.keys[0]] == VerifyResult(score=0.0, reason="error: ValueError: bad input 7")
        assert out[1].reward == 1.0
        assert pool.stats()["errors"] == 1 and pool.stats()["restarts"] == 0


def test_v14_batch_keeps_order_and_length_with_real_math() -> None:
    # case V14: 5 outputs, two of them "I don't know." and empty: 5 results, in order, failures 0 with a reason
    responses = [r"so \boxed{4}", "I don't know.", r"\boxed{9}", "", r"2+2 = \boxed{5}"]
    golds = ["4", "4", "9", "1", "4"]
    with ScoringPool([VerifierSpec(name="math")], num_workers=2, timeout_s=10.0) as pool:
        out = pool.score(responses, golds, [{}] * 5)
    assert len(out) == 5
    assert [s.reward for s in out] == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert reasons(out, "math") == [None, "no_answer", None, "no_answer", "wrong"]
    assert [s.results["math"].parsed for s in out] == ["4", None, "9", None, "5"]


def test_mixed_failures_keep_order_across_workers() -> None:
    responses = ["a", "hang", "b", "die", "c", "raise", "d", "hang", "e"]
    golds = ["a", "x", "b", "x", "z", "x", "d", "x", "e"]
    with ScoringPool([spec("misbehave")], num_workers=2, timeout_s=1.0) as pool:
        t0 = time.monotonic()
        out = pool.score(responses, golds, [{}] * len(responses))
        elapsed = time.monotonic() - t0
        key = pool.keys[0]
        assert [s.reward for s in out] == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0]
        assert reasons(out, key) == [
            None, "timeout", None, "crashed", "wrong", "error: ValueError: bad input x", None, "timeout", None,
        ]
        # "die" is scored twice (two crashes): the answer kills its workers
        assert pool.stats() == {"samples": 10, "timeouts": 2, "crashes": 2, "errors": 1, "restarts": 4, "rescored": 0}
    # two hangs of 1 s each, overlapping or not, plus restarts: far below 9 samples x 1 s
    assert elapsed < 2 * 1.0 + 5.0


def test_weighted_reward_and_metrics() -> None:
    # reward = 0.25 * numeric + 2.0 * Length(max_chars=3)
    specs = [VerifierSpec(name="numeric", weight=0.25), spec("Length", weight=2.0, max_chars=3)]
    with ScoringPool(specs, num_workers=2, timeout_s=10.0) as pool:
        assert pool.keys == ["numeric", "Length"]
        out = pool.score(["12", "the answer is 12", "x", "abcd"], ["12", "12", "3", "1"], [{}] * 4)
    # "12": 0.25*1 + 2*1 = 2.25; long right answer: 0.25*1 + 0 = 0.25; "x": 0 + 2 = 2.0; "abcd" (not a
    # number, 4 chars): 0 + 0 = 0
    assert [s.reward for s in out] == [2.25, 0.25, 2.0, 0.0]
    assert out[1].results["Length"].reason == "too_long"
    m = reward_metrics(out)
    assert m["reward/mean"] == pytest.approx((2.25 + 0.25 + 2.0 + 0.0) / 4)
    assert m["reward/no_answer_frac"] == pytest.approx(2 / 4)  # "x" and "abcd" hold no number
    assert m["reward/timeout_frac"] == 0.0 and m["reward/crash_frac"] == 0.0
    assert m["reward/score/numeric"] == pytest.approx(2 / 4)
    assert m["reward/latency_max_s"] == max(s.latency_s for s in out)


def test_reward_metrics_fractions() -> None:
    def scored(reason: str | None, reward: float) -> Scored:
        return Scored(reward=reward, results={"v": VerifyResult(score=reward, reason=reason)}, latency_s=0.5)

    batch = [scored("timeout", 0.0), scored("crashed", 0.0), scored("error: KeyError: 'x'", 0.0),
             scored(None, 1.0), scored("timeout", 0.0)]
    m = reward_metrics(batch)
    assert m["reward/timeout_frac"] == 2 / 5 and m["reward/crash_frac"] == 1 / 5
    assert m["reward/error_frac"] == 1 / 5 and m["reward/mean"] == 1 / 5
    assert reward_metrics([]) == {}


def test_rows_are_passed_without_reserved_keys() -> None:
    with ScoringPool([spec("uses_row")], num_workers=1, timeout_s=5.0) as pool:
        out = pool.score(["r"], ["g"], [{"bonus": 0.5, "gold": "clash", "response": "clash", "level": 3}])
    assert out[0].reward == 0.5
    assert out[0].results[pool.keys[0]].parsed == "bonus,level"


def test_memory_limit() -> None:
    with ScoringPool([spec("misbehave")], num_workers=1, timeout_s=10.0, memory_mb=1024) as pool:
        out = pool.score(["hog", "1"], ["x", "1"], [{}, {}])
    assert out[0].results[pool.keys[0]].reason == "error: MemoryError: "
    assert out[1].reward == 1.0


def test_relative_file_path_survives_chdir(tmp_path, monkeypatch) -> None:
    rel = os.path.relpath(HERE)
    with ScoringPool([VerifierSpec(name=f"{rel}:misbehave")], num_workers=1, timeout_s=5.0) as pool:
        monkeypatch.chdir(tmp_path)
        assert pool.keys == ["misbehave"]  # results are keyed by the attribute, however the file is named
        assert [s.reward for s in pool.score(["1"], ["1"], [{}])] == [1.0]


def test_construction_errors() -> None:
    with pytest.raises(UnknownVerifierError, match="Did you mean 'math'"):
        ScoringPool([VerifierSpec(name="maht")], num_workers=1, timeout_s=1.0)
    with pytest.raises(RuntimeError, match="no such model file"):
        ScoringPool([spec("BrokenInit")], num_workers=1, timeout_s=1.0)
    with pytest.raises(ValueError):
        ScoringPool([], num_workers=1, timeout_s=1.0)
    with pytest.raises(ValueError):
        ScoringPool([VerifierSpec(name="numeric")], num_workers=0, timeout_s=1.0)


def test_lengths_must_match_and_close() -> None:
    pool = ScoringPool([VerifierSpec(name="numeric")], num_workers=2, timeout_s=5.0)
    procs = [w.proc for w in pool._pool._workers]
    with pytest.raises(ValueError, match="equal lengths"):
        pool.score(["1", "2"], ["1"], [{}, {}])
    assert pool.score([], [], []) == []
    pool.close()
    pool.close()  # idempotent
    assert not any(p.is_alive() for p in procs)
    with pytest.raises(RuntimeError, match="close"):
        pool.score(["1"], ["1"], [{}])


def test_reward_worker_plain_class() -> None:
    worker = RewardWorker([VerifierSpec(name="numeric")], num_workers=1, timeout_s=5.0)
    try:
        out = worker.score(["#### 1,000", "12"], ["1000", "13"], [{}, {}])
        assert [s.reward for s in out] == [1.0, 0.0]
        assert worker.stats()["samples"] == 2
    finally:
        worker.close()


def test_spawn_start_method() -> None:
    with ScoringPool([spec("misbehave")], num_workers=1, timeout_s=5.0, start_method="spawn") as pool:
        out = pool.score(["1", "die", "2"], ["1", "1", "2"], [{}, {}, {}])
    assert [s.reward for s in out] == [1.0, 0.0, 1.0]
    assert out[1].results[pool.keys[0]].reason == "crashed"


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has exited
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_hung_workers_exit_when_the_pool_process_is_killed(tmp_path) -> None:
    script = tmp_path / "owner.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, threading, time
            from rlvr.config import VerifierSpec
            from rlvr.reward import ScoringPool

            if __name__ == "__main__":
                pool = ScoringPool([VerifierSpec(name={HERE!r} + ":misbehave")], num_workers=2, timeout_s=600.0)
                print(" ".join(str(w.proc.pid) for w in pool._pool._workers), flush=True)
                threading.Thread(target=pool.score, args=(["hang", "hang"], ["1", "1"], [{{}}, {{}}])).start()
                time.sleep(1.0)
                os.kill(os.getpid(), 9)  # no close(), no atexit
            """
        )
    )
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("w") as fo, err.open("w") as fe:  # files, not pipes: a surviving worker would hold a pipe open
        rc = subprocess.run([sys.executable, str(script)], stdout=fo, stderr=fe, timeout=120).returncode
    assert rc == -9, err.read_text()[-2000:]
    pids = [int(x) for x in out.read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10.0
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if not _gone(pid)]
    for pid in left:  # do not leave them spinning if the check fails
        os.kill(pid, 9)
    assert left == [], "hung scoring workers outlived the pool's process"
