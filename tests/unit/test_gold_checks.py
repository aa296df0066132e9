"""Load-time gold checks (rlvr.reward.golds), case V15 of /work/shared/cases/README.md, on made-up rows and on
every gold of the real data sets in data/ (GSM8K train and test, SVAMP, MATH-500: all usable)."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from rlvr.config import DataConfig, RecipeError, VerifierSpec
from rlvr.recipe import load_recipe
from rlvr.data import load_rows
from rlvr.reward.golds import check_golds, gold_checker, math_gold_problem, prose_problem
from rlvr_verifiers.math import MathVerifier

V15_GOLD = "Anya needs to climb one floor"
REPO = Path(__file__).resolve().parents[2]


def rows_of(*golds: str) -> list[dict]:
    return [{"question": f"q{i}", "gold": g, "row": {"i": i}} for i, g in enumerate(golds)]


@pytest.mark.parametrize("name", ["math", "numeric", "gsm8k"])
def test_v15_prose_gold_is_dropped(name: str, caplog: pytest.LogCaptureFixture) -> None:
    rows = rows_of("42", V15_GOLD, "7", "1,000")
    with caplog.at_level(logging.WARNING, logger="rlvr.reward.golds"):
        kept, report = check_golds(rows, [VerifierSpec(name=name)])
    assert [r["gold"] for r in kept] == ["42", "7", "1,000"]  # row 1 dropped, order kept
    assert (report.total, report.kept, report.checked, report.mode) == (4, 3, True, "drop")
    assert [(b.index, b.gold) for b in report.bad] == [(1, V15_GOLD)]
    assert "1 of 4 rows" in caplog.text and "row 1: 'Anya needs to climb one floor'" in caplog.text


def test_v15_error_mode_stops_the_run() -> None:
    with pytest.raises(RecipeError, match=r"1 of 3 rows .*row 2: 'Anya needs.*data.bad_gold=drop"):
        check_golds(rows_of("1", "2", V15_GOLD), [VerifierSpec(name="math")], mode="error")


def test_all_bad_is_an_error_even_when_dropping() -> None:
    with pytest.raises(RecipeError, match="No row is left"):
        check_golds(rows_of(V15_GOLD, "n/a"), [VerifierSpec(name="numeric")])


def test_report_shows_five_examples_and_the_count() -> None:
    rows = rows_of(*(["five"] * 7 + ["5"]))
    kept, report = check_golds(rows, [VerifierSpec(name="numeric")])
    assert len(kept) == 1 and len(report.bad) == 7
    summary = report.summary()
    assert summary.count("(not one number)") == 5 and summary.endswith("and 2 more")
    assert "7 of 8 rows" in summary


def test_math_gold_reasons() -> None:
    mv = MathVerifier()
    for usable in ["42", r"\frac{1}{2}", r"\text{Evelyn}", r"5.4 \text{ cents}", "(0,1)", r"28\%",
                   r"\begin{pmatrix} -1 \\ 2 \end{pmatrix}", "Monday, Wednesday, Friday",
                   r"The sum is 10, so $\boxed{10}$."]:  # a solution with a box: its box is the answer
        assert math_gold_problem(mv, usable) is None, usable
    assert math_gold_problem(mv, V15_GOLD) == "reads as prose (6 words), not an answer"
    assert math_gold_problem(mv, "The answer is 5") == "reads as prose (3 words), not an answer"
    assert math_gold_problem(mv, r"\boxed{}") == "empty answer"
    assert prose_problem(r"\text{no solution}") is None  # two words: an answer


def test_first_verifier_is_the_one_checked() -> None:
    # format ignores golds (check_gold -> None), so a prose gold passes when format comes first
    specs = [VerifierSpec(name="format", args={"boxed": True}), VerifierSpec(name="numeric")]
    kept, report = check_golds(rows_of(V15_GOLD), specs)
    assert len(kept) == 1 and report.verifier == "format"
    kept, _ = check_golds(rows_of(V15_GOLD, "3"), list(reversed(specs)))
    assert [r["gold"] for r in kept] == ["3"]


def test_builtin_check_golds() -> None:
    kept, report = check_golds(rows_of("24", "24.5"), [VerifierSpec(name="countdown")])
    assert [b.index for b in report.bad] == [1]
    kept, report = check_golds(rows_of("B", "(C)", "G", "both"), [VerifierSpec(name="choice")])
    assert [b.index for b in report.bad] == [2, 3]  # G is past A-E


def test_plugin_check_gold_and_verifier_without_one(tmp_path: Path) -> None:
    plugin = tmp_path / "plug.py"
    plugin.write_text(textwrap.dedent(
        """
        class WithCheck:
            def verify(self, response, gold, **row):
                return float(response == gold)

            def check_gold(self, gold):
                return None if gold.isupper() else "not upper case"

        def plain(response, gold, **row):
            return response == gold

        def checked(response, gold, **row):
            return response == gold

        def _raise(gold):
            raise KeyError(gold)

        checked.check_gold = _raise
        """
    ))
    kept, report = check_golds(rows_of("AB", "cd"), [VerifierSpec(name=f"{plugin}:WithCheck")])
    assert [r["gold"] for r in kept] == ["AB"] and report.bad[0].reason == "not upper case"
    kept, report = check_golds(rows_of("anything", V15_GOLD), [VerifierSpec(name=f"{plugin}:plain")])
    assert len(kept) == 2 and not report.checked  # no check_gold: skipped, nothing dropped
    assert report.summary() == f"golds not checked: verifier '{plugin}:plain' has no check_gold"
    with pytest.raises(RecipeError, match=r"error: KeyError"):  # a raising check names the row, mode error
        check_golds(rows_of("x"), [VerifierSpec(name=f"{plugin}:checked")], mode="error")
    assert gold_checker(VerifierSpec(name="rlvr_verifiers.example_custom:yes_no"))("maybe") is not None


def test_bad_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="drop' or 'error'"):
        check_golds(rows_of("1"), [VerifierSpec(name="numeric")], mode="keep")


def test_recipe_field_bad_gold(tmp_path: Path) -> None:
    assert DataConfig().bad_gold == "drop"
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  source: generated\n")
    assert load_recipe(recipe, ["data.bad_gold=error"]).data.bad_gold == "error"
    with pytest.raises(RecipeError):
        load_recipe(recipe, ["data.bad_gold=keep"])


# ---------------------------------------------------------------------------------------------------------
# real data: every gold is usable (counts: GSM8K 7473 + 1319, SVAMP 1000, MATH-500 500, AIME 30 + 30, AMC 40)

REAL = [
    ("gsm8k train", DataConfig(source=str(REPO / "data/gsm8k/train.jsonl"), answer_format="gsm8k"), 7473, "gsm8k"),
    ("gsm8k test", DataConfig(source=str(REPO / "data/gsm8k/test.jsonl"), answer_format="gsm8k"), 1319, "numeric"),
    ("gsm8k test, full solution as gold", DataConfig(source=str(REPO / "data/gsm8k/test.jsonl")), 1319, "gsm8k"),
    ("svamp", DataConfig(source=str(REPO / "data/svamp/test.jsonl"), question="{Body} {Question}", answer="Answer"),
     1000, "numeric"),
    ("svamp, math", DataConfig(source=str(REPO / "data/svamp/test.jsonl"), question="{Body} {Question}",
                               answer="Answer"), 1000, "math"),
    ("math500", DataConfig(source=str(REPO / "data/math500/test.jsonl"), question="problem"), 500, "math"),
    ("aime24", DataConfig(source=str(REPO / "data/aime24/test.jsonl"), question="problem"), 30, "math"),
    ("aime25", DataConfig(source=str(REPO / "data/aime25/test.jsonl"), question="problem"), 30, "math"),
    ("amc23", DataConfig(source=str(REPO / "data/amc23/test.jsonl"), question="problem"), 40, "math"),
    ("amc23, numeric", DataConfig(source=str(REPO / "data/amc23/test.jsonl"), question="problem"), 40, "numeric"),
]


@pytest.mark.parametrize("label, cfg, n, verifier", REAL, ids=[r[0] for r in REAL])
def test_real_golds_all_usable(label: str, cfg: DataConfig, n: int, verifier: str) -> None:
    rows = load_rows(cfg, 0)
    kept, report = check_golds(rows, [VerifierSpec(name=verifier)])
    assert (len(rows), len(kept), report.bad) == (n, n, ())


# ---------------------------------------------------------------------------------------------------------
# issue 9 item 12: golds that load but would be read wrong are named with the setting that fixes them

GSM8K_SOLUTION = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18"


def test_worked_solution_gold_names_answer_format() -> None:
    why = math_gold_problem(MathVerifier(), GSM8K_SOLUTION)
    assert why is not None and "whole worked solution" in why and "'18'" in why
    assert "answer_format: gsm8k" in why and "--answer-format gsm8k" in why
    prose = "First add 2 and 3 to get 5. Then double it to get 10.\nSo she has ten."  # 2 sentences, no marker
    assert "whole worked solution" in math_gold_problem(MathVerifier(), prose)
    assert math_gold_problem(MathVerifier(), r"First add them. So $\boxed{10}$.") is None  # its box is the answer


def test_gsm8k_test_with_raw_gold_is_refused_for_math() -> None:
    # the measured case: the full GSM8K solution as gold (answer_format forgotten); every one of 1319 is refused
    rows = load_rows(DataConfig(source=str(REPO / "data/gsm8k/test.jsonl")), 0)
    with pytest.raises(RecipeError, match=r"1319 of 1319 rows .*answer_format: gsm8k.*No row is left"):
        check_golds(rows, [VerifierSpec(name="math")])
    kept, _ = check_golds(rows, [VerifierSpec(name="numeric")])  # numeric reads the number after '####'
    assert len(kept) == 1319


@pytest.mark.parametrize("name", ["math", "numeric"])
def test_labelled_gold_rule(name: str) -> None:
    rows = rows_of("9 (apples)", "12 km/h", "7")
    kept, report = check_golds(rows, [VerifierSpec(name=name)])  # units: number (default): compared by number
    assert len(kept) == 3 and report.bad == ()
    kept, report = check_golds(rows, [VerifierSpec(name=name, args={"units": "refuse"})])
    assert [r["gold"] for r in kept] == ["7"]
    assert "a number followed by a label ('apples')" in report.bad[0].reason
    assert "units: number" in report.bad[0].reason


@pytest.mark.parametrize("name", ["math", "numeric"])
def test_every_label_form_is_read_or_refused_at_load(name: str) -> None:
    # issue 23: one-letter units and words math-verify reads as products are labels too: usable under units:
    # number, refused with the fix under units: refuse (never a silent product such as 42*g)
    rows = rows_of("42 (g)", "3.5 (times)", "12 (m/s)", "7")
    kept, report = check_golds(rows, [VerifierSpec(name=name)])
    assert len(kept) == 4 and report.bad == ()
    kept, report = check_golds(rows, [VerifierSpec(name=name, args={"units": "refuse"})])
    assert [r["gold"] for r in kept] == ["7"]
    assert [b.reason.split(" under")[0] for b in report.bad] == [
        "a number followed by a label ('g')", "a number followed by a label ('times')",
        "a number followed by a label ('m/s')"]  # fmt: skip


def test_gsm8k_verifier_check_gold_follows_its_unit_rule():
    """The gsm8k verifier's load check reads a labelled gold the way its verify does (units: number by default)."""
    from rlvr_verifiers.gsm8k import Gsm8kVerifier

    assert Gsm8kVerifier().check_gold("9 (apples)") is None
    assert "units: number" in Gsm8kVerifier(units="refuse").check_gold("9 (apples)")


STUCK = '''
import threading

RELEASE = threading.Event()


def stuck(response, gold, **row):
    return response == gold


def _check(gold):
    if gold == "7":
        RELEASE.wait()  # never returns until the test releases it
    return None


stuck.check_gold = _check
'''


@pytest.mark.timeout(60)
def test_check_gold_that_never_returns_stops_the_load_naming_the_row(tmp_path: Path, capsys) -> None:
    """Issue 24 item 2: a check_gold that never returns hung the run forever at data load (in the driver, before
    any deadline). Now each gold's check has timeouts.gold_check_s: past it the load stops with the verifier, the
    row (index and id), the gold and the key; through rlvr train --dry-run too, in about that time."""
    import time

    from rlvr.cli import main
    from rlvr.reward.base import resolve_verifier

    plugin = tmp_path / "stuck.py"
    plugin.write_text(STUCK)
    name = f"{plugin}:stuck"
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"question": "q{i}", "answer": "{g}", "id": "r{i}"}}\n'
                            for i, g in enumerate(["1", "2", "1", "7", "7"])))
    expected = (f"verifier '{name}': check_gold did not return within 0.5 s (timeouts.gold_check_s) for row 3 "
                "(id 'r3'), gold '7'. A check_gold must return None or a reason promptly: fix the verifier's "
                "check_gold (or that row), or raise timeouts.gold_check_s if it is only slow")
    t0 = time.monotonic()
    try:
        rc = main(["train", str(REPO / "recipes" / "tiny_test.yaml"), f"data.source={data}",
                   f"reward.verifiers=[{{name: '{name}'}}]", "timeouts.gold_check_s=0.5", "--dry-run"])
        err = capsys.readouterr().err
        assert (rc, err) == (2, f"rlvr train: {expected}\n")
        rows = [{"question": "q", "gold": g, "row": {"id": f"r{i}"}} for i, g in enumerate(["1", "7"])]
        with pytest.raises(RecipeError) as e:
            check_golds(rows, [VerifierSpec(name=name)], deadline_s=0.2, deadline_key=None)  # rlvr eval: no key
        assert str(e.value).endswith("for row 1 (id 'r1'), gold '7'. A check_gold must return None or a reason "
                                     "promptly: fix the verifier's check_gold (or that row)")
    finally:
        resolve_verifier(name).__globals__["RELEASE"].set()  # let the abandoned checks end
    assert time.monotonic() - t0 < 30


def test_a_slow_check_gold_is_logged_while_the_load_waits(monkeypatch, caplog) -> None:
    """A check past SLOW_GOLD_S is named on the console while the load goes on waiting (a newcomer saw a silent
    minute); one that returns before its deadline is used."""
    import time

    import rlvr.reward.golds as golds

    monkeypatch.setattr(golds, "SLOW_GOLD_S", 0.1)

    def slow(gold: str) -> str | None:
        time.sleep(0.4 if gold == "2" else 0.0)
        return None if gold != "3" else "not one number"

    with caplog.at_level("WARNING", logger="rlvr.reward.golds"):
        verdicts = golds._verdicts(slow, ["1", "2", "3"], 5.0, "verifier 'v': check_gold (timeouts.gold_check_s)")
    assert verdicts == {"1": None, "2": None, "3": "not one number"}
    assert caplog.messages == ["verifier 'v': check_gold (timeouts.gold_check_s) has not returned for the gold '2' "
                               "after 0.1 s: waiting up to 5 s"]
