"""Role busy/idle accounting and the staleness histogram (rlvr.metrics.timeline), on spans worked out by hand."""

from __future__ import annotations

from collections import namedtuple

import pytest

from rlvr.metrics import names as mn
from rlvr.metrics.timeline import role_group, role_usage, staleness_metrics

S = namedtuple("S", "role method start end")


def test_busy_idle_and_overlap_by_hand():
    # a 10 s step: engine0 generates 0-4 and 6-9 (7 s), engine1 0-2 (2 s): engines mean 4.5 s; the trainer
    # trains 3-8 (5 s) and sends 9-10 while the engines receive 9-10 (sync 1 s, also busy for both groups);
    # reward scores 4-5; generation and training overlap at 3-4 and 6-8: 3 s of 10
    spans = [S("engine0", "generate", 0, 4), S("engine0", "generate", 6, 9), S("engine1", "generate", 0, 2),
             S("trainer0", "train_step", 3, 8), S("trainer0", "send_weights", 9, 10),
             S("engine0", "receive_weights", 9, 10), S("engine1", "receive_weights", 9, 10),
             S("reward", "score", 4, 5)]  # fmt: skip
    m = role_usage(spans, 0.0, 10.0)
    assert m[mn.role_busy("engines")] == pytest.approx((8 + 3) / 2)  # engine0 7 + 1 receive, engine1 2 + 1
    assert m[mn.role_idle("engines")] == pytest.approx(10 - 5.5)
    assert m[mn.role_busy("trainer")] == pytest.approx(6.0)
    assert m[mn.role_busy("reward")] == pytest.approx(1.0)
    assert m[mn.role_busy("sync")] == pytest.approx(1.0) and m[mn.role_idle("sync")] == pytest.approx(9.0)
    assert m[mn.ROLES_OVERLAP_FRAC] == pytest.approx(0.3)
    assert mn.role_busy("critic") not in m  # no critic span: no critic metrics


def test_spans_are_clipped_to_the_window():
    m = role_usage([S("engine0", "generate", -5, 2), S("trainer0", "train_step", 8, 20)], 0.0, 10.0)
    assert m[mn.role_busy("engines")] == pytest.approx(2.0) and m[mn.role_busy("trainer")] == pytest.approx(2.0)
    assert m[mn.ROLES_OVERLAP_FRAC] == 0.0
    with pytest.raises(ValueError):
        role_usage([], 2.0, 1.0)


def test_role_groups():
    assert [role_group(x) for x in ("engine0", "engine12", "trainer3", "reward", "critic", "engineX")] == [
        "engines", "engines", "trainer", "reward", "critic", "engineX"]


def _sample(versions, token_versions=None):
    from rlvr.types import Completion

    n = len(token_versions) if token_versions is not None else 2
    return Completion(prompt_index=0, sample_index=0, prompt_ids=[1], token_ids=[7] * n, logprobs=[-1.0] * n,
                      text="", finish_reason="stop", policy_version=versions, token_versions=token_versions)


def test_staleness_histogram_by_hand():
    # trainer at version 5; samples of versions 5, 4, 4, 3 (2 tokens each, one version each): lags 0, 1, 1, 2
    m = staleness_metrics([_sample(v) for v in (5, 4, 4, 3)], 5, 2)
    assert m[mn.ASYNC_STALENESS_MEAN] == pytest.approx(1.0) and m[mn.ASYNC_STALENESS_MAX] == 2.0
    assert [m[mn.staleness(k)] for k in range(3)] == [0.25, 0.5, 0.25]
    assert [m[mn.token_staleness(k)] for k in range(3)] == [0.25, 0.5, 0.25]
    assert m[mn.ASYNC_SPANNING_FRAC] == 0.0


def test_staleness_per_token_and_spanning_by_hand():
    """In-flight updates: sample A's 4 tokens by versions 3, 3, 4, 5 (labelled by its oldest, 3), sample B's 2 by 5,
    a multi-turn sample C with tokens 4, -1 (environment), -1, 4. Trainer at 5. Per sample lags 2, 0, 1: mean 1,
    max 2, histogram [1/3, 1/3, 1/3]. Per sampled token (8: C's environment tokens are not sampled) the lags are
    A 2, 2, 1, 0; B 0, 0; C 1, 1: mean 7/8, histogram [3/8, 3/8, 2/8]. Spanning: A only, 1/3."""
    a, b, c = _sample(3, [3, 3, 4, 5]), _sample(5, [5, 5]), _sample(4, [4, -1, -1, 4])
    m = staleness_metrics([a, b, c], 5, 2)
    assert m[mn.ASYNC_STALENESS_MEAN] == pytest.approx(1.0) and m[mn.ASYNC_STALENESS_MAX] == 2.0
    assert [m[mn.staleness(k)] for k in range(3)] == pytest.approx([1 / 3] * 3)
    assert m[mn.ASYNC_TOKEN_STALENESS_MEAN] == pytest.approx(7 / 8)
    assert [m[mn.token_staleness(k)] for k in range(3)] == pytest.approx([3 / 8, 3 / 8, 2 / 8])
    assert m[mn.ASYNC_SPANNING_FRAC] == pytest.approx(1 / 3)


def test_the_timeline_file_holds_each_span_clipped_to_its_step(tmp_path):
    """``RUN/timeline.jsonl`` (append_step): a span crossing the step's start or end is written clipped to it, with
    the clipped length; spans wholly outside the window (or touching it at one instant) are left out; times are
    seconds after ``origin``, in the spans' order; each call appends one row."""
    from rlvr.metrics.timeline import TIMELINE_FILE, append_step, read_timeline

    spans = [S("engine0", "generate", 95.0, 103.0),  # crosses the start: 100-103, 3 s
             S("reward", "score", 101.5, 102.25),  # inside: as it is, 0.75 s
             S("engine0", "generate", 80.0, 99.0),  # the step before: left out
             S("trainer0", "train_step", 104.0, 112.5),  # crosses the end: 104-110, 6 s
             S("engine0", "receive_weights", 110.0, 111.0),  # starts at the end: left out
             S("engine0", "generate", 111.0, 115.0)]  # the step after: left out  # fmt: skip
    append_step(tmp_path, 3, 100.0, 110.0, spans, origin=90.0)
    append_step(tmp_path, 4, 110.0, 116.0, spans, origin=90.0)
    rows = read_timeline(tmp_path / TIMELINE_FILE)
    assert rows[0] == {"step": 3, "start": 10.0, "end": 20.0,
                       "spans": [["engine0", "generate", 10.0, 13.0], ["reward", "score", 11.5, 12.25],
                                 ["trainer0", "train_step", 14.0, 20.0]]}  # fmt: skip
    assert [b - a for _, _, a, b in rows[0]["spans"]] == [3.0, 0.75, 6.0]
    # step 4 (110-116): the rest of the update (110-112.5), the reload, and a generation inside it
    assert rows[1] == {"step": 4, "start": 20.0, "end": 26.0,
                       "spans": [["trainer0", "train_step", 20.0, 22.5], ["engine0", "receive_weights", 20.0, 21.0],
                                 ["engine0", "generate", 21.0, 25.0]]}  # fmt: skip


def test_staleness_of_one_sample_two_versions_and_an_empty_batch():
    """One sample of tokens by versions 4, 5 (trainer at 5; bound 1): lag 1 by its oldest token, tokens 1/2 at lag 0
    and 1/2 at lag 1, spanning 1 (two versions are enough), histograms for n = 0, 1 only. An empty batch: zeros."""
    m = staleness_metrics([_sample(4, [4, 5])], 5, 1)
    assert m[mn.ASYNC_STALENESS_MEAN] == 1.0 and m[mn.staleness(1)] == 1.0 and m[mn.ASYNC_SPANNING_FRAC] == 1.0
    assert m[mn.token_staleness(0)] == 0.5 and m[mn.ASYNC_TOKEN_STALENESS_MEAN] == 0.5
    assert not any(k.endswith("/2") for k in m)
    e = staleness_metrics([], 5, 1)
    assert e[mn.ASYNC_STALENESS_MAX] == 0.0 and e[mn.ASYNC_STALENESS_MEAN] == 0.0 and e[mn.ASYNC_SPANNING_FRAC] == 0.0
