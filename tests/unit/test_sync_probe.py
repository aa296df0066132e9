"""The sync probe's pure parts (rlvr.sync.probe): the gap, the tolerance by dtype, the fixed prompt, the verdict,
and the recipe settings. Fake roles stand in for the engines and the trainer (milliseconds); the real engines are
in tests/integration/test_sync_engine.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rlvr.config import RecipeError
from rlvr.recipe import load_recipe
from rlvr.sync.probe import PROBE_NEW_TOKENS, PROBE_PROMPT_TOKENS, mean_gap, probe_gap, probe_prompt, run_probe, tolerance
from rlvr.sync.weights import WeightSyncError

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny_test.yaml"


def test_probe_gap_is_the_largest_absolute_difference_and_mean_gap_the_mean():
    # |-1.0 - -1.25| = 0.25, |-2.0 - -1.5| = 0.5, |-0.5 - -0.5| = 0: max 0.5, mean 0.75 / 3 = 0.25
    assert probe_gap([-1.0, -2.0, -0.5], [-1.25, -1.5, -0.5]) == pytest.approx(0.5)
    assert mean_gap([-1.0, -2.0, -0.5], [-1.25, -1.5, -0.5]) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="unequal"):
        probe_gap([-1.0], [-1.0, -2.0])
    with pytest.raises(ValueError):
        probe_gap([], [])


def test_tolerance_by_dtype_unless_set():
    assert tolerance("float32", None) == 2e-4
    assert tolerance("bfloat16", None) == 0.1
    assert tolerance("float16", None) == 0.1
    assert tolerance("bfloat16", 0.05) == 0.05


def test_probe_prompt_repeats_the_text_to_the_cap():
    from rlvr.models import resolve_model

    model = resolve_model("tiny-random")  # one token per character
    ids = probe_prompt(model, 1000)
    assert len(ids) == PROBE_PROMPT_TOKENS == 200
    # the tiny tokenizer lower-cases: 'q' (4 + 10 digits + 16) = 30, 'u' = 34
    assert ids[:2] == [30, 34]
    assert probe_prompt(model, 64) == ids[:64]  # capped by the context, same tokens
    with pytest.raises(ValueError, match="context"):
        probe_prompt(model, 1)


class _Call:
    def __init__(self, value):
        self.value = value


class _Role:
    """A fake role whose ``probe_logprobs`` returns a fixed answer (and records what it was asked)."""

    def __init__(self, answer):
        self.answer, self.asked = answer, []

    def call(self, method, *args):
        assert method == "probe_logprobs"
        self.asked.append(args)
        return _Call(self.answer)


def _get(calls, timeout_s, what):
    return [c.value for c in calls]


def _seq(gen_lps):
    """Engine logprobs of a 3-token prompt (2 scored) + the 8 generated tokens: prompt part -1.0 each."""
    return [-1.0, -1.0] + list(gen_lps)


def test_run_probe_returns_both_means_and_scores_each_engines_own_tokens():
    e0 = _Role((list(range(8)), _seq([-0.1] * 8)))
    e1 = _Role((list(range(10, 18)), _seq([-0.3] * 8)))
    # engine0: the trainer differs by 1e-4 on one generated token; engine1: by 2e-5 on every token
    t0 = _seq([-0.1] * 7 + [-0.1001])
    t1 = [x - 2e-5 for x in _seq([-0.3] * 8)]
    trainer = _Role([t0, t1])
    out = run_probe(_get, [e0, e1], [trainer], [1, 2, 3], tol=1e-4, version=4, dtype="float32", timeout_s=9)
    assert out["sync/probe_gap_mean"] == pytest.approx(2e-5)  # max(1e-4 / 10, 2e-5)
    assert out["sync/probe_gap_gen_mean"] == pytest.approx(2e-5)  # max(1e-4 / 8 = 1.25e-5, 2e-5)
    assert out["sync/probe_gap_max"] == pytest.approx(1e-4)
    assert e0.asked == [([1, 2, 3], PROBE_NEW_TOKENS)]
    assert trainer.asked == [([1, 2, 3], [list(range(8)), list(range(10, 18))])]


@pytest.mark.parametrize("prompt_off,gen_off", [(0.0, 0.53), (0.53, 0.0), (math.nan, 0.0)])
def test_run_probe_fails_loudly_when_either_mean_is_above_the_tolerance(prompt_off, gen_off):
    """A gap only on the generated tokens (a kept prefix cache) fails as well as one on the prompt's."""
    e0 = _Role((list(range(8)), _seq([-1.0] * 8)))
    e1 = _Role((list(range(8)), _seq([-1.0] * 8)))
    bad = [-1.0 - prompt_off] * 2 + [-1.0 - gen_off] * 8
    trainer = _Role([_seq([-1.0] * 8), bad])
    with pytest.raises(WeightSyncError, match=r"engine1 \(policy version 3\).*sync.probe_tolerance"):
        run_probe(_get, [e0, e1], [trainer], [1, 2, 3], tol=1e-3, version=3, dtype="float32", timeout_s=9)


def test_probe_settings_load_and_are_checked():
    r = load_recipe(TINY, [])
    assert r.sync.probe_every == 1 and r.sync.probe_tolerance is None
    r = load_recipe(TINY, ["sync.probe_every=5", "sync.probe_tolerance=0.01"])
    assert r.sync.probe_every == 5 and r.sync.probe_tolerance == 0.01
    with pytest.raises(RecipeError, match="probe_every"):
        load_recipe(TINY, ["sync.probe_every=-1"])
    with pytest.raises(RecipeError, match="probe_tolerance"):
        load_recipe(TINY, ["sync.probe_tolerance=0"])
