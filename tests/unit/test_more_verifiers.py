"""Built-in verifiers countdown, format, choice, gsm8k, the worked custom example, and the percentage policy.

Case V4 (percentages) and V13 (an empty answer must not score) come from /work/shared/cases/README.md; the V4
policy they pin is written in docs/verifiers.md. Every other expected value is worked out by hand in a comment.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from rlvr.config import VerifierSpec
from rlvr.reward import VERIFIERS, build_verifier
from rlvr_verifiers.choice import ChoiceVerifier, answer_letters
from rlvr_verifiers.countdown import CountdownVerifier, evaluate, extract_expression, parse_target
from rlvr_verifiers.example_custom import TextAnswerVerifier, yes_no
from rlvr_verifiers.format import FormatVerifier
from rlvr_verifiers.gsm8k import Gsm8kVerifier
from rlvr_verifiers.math import MathVerifier
from rlvr_verifiers.numeric import NumericVerifier, parse_gold_number

NUMS = {"numbers": [6, 4, 2, 8]}


def test_new_builtins_resolve_by_short_name() -> None:
    for name, cls in [("countdown", CountdownVerifier), ("choice", ChoiceVerifier), ("gsm8k", Gsm8kVerifier)]:
        assert name in VERIFIERS
        assert isinstance(build_verifier(VerifierSpec(name=name)), cls)
    fmt = build_verifier(VerifierSpec(name="format", args={"think": True}))
    assert isinstance(fmt, FormatVerifier) and fmt.think and not fmt.boxed


# ---------------------------------------------------------------------------------------------------------
# countdown


@pytest.mark.parametrize(
    "response, score, reason",
    [
        ("<answer>(6+4)*2</answer>", 1.0, None),  # 10*2 = 20; 8 unused is allowed
        ("<answer>(6+4)*2 = 20</answer>", 1.0, None),  # the '= 20' claim is dropped, the expression checked
        ("<answer>8*2+4</answer>", 1.0, None),  # 16+4 = 20
        ("<answer>6*4-2-2</answer>", 0.0, "number_reused: 2"),  # 24-4 = 20 but 2 is given once
        ("<answer>6*4-4</answer>", 0.0, "number_reused: 4"),
        ("<answer>5*4</answer>", 0.0, "unknown_number: 5"),  # 20, but 5 is not given
        ("<answer>6*4</answer>", 0.0, "wrong"),  # 24
        ("<answer>8/(6-6)</answer>", 0.0, "number_reused: 6"),  # usage is counted before the value matters
        ("<answer>8/(4-4/2-2)</answer>", 0.0, "number_reused: 4"),
        ("<answer>2/(6-6)</answer>", 0.0, "number_reused: 6"),
        ("<answer>8/(2-2)</answer>", 0.0, "number_reused: 2"),
        ("<answer>(6 - 4)*8 + 2*2</answer>", 0.0, "number_reused: 2"),
        ("<answer>__import__('os').system('true')</answer>", 0.0, "bad_expression: Call not allowed"),
        ("<answer>2**4+4</answer>", 0.0, "bad_expression: Pow not allowed"),
        ("<answer>8//2</answer>", 0.0, "bad_expression: FloorDiv not allowed"),
        ("<answer>x+20</answer>", 0.0, "bad_expression: Name not allowed"),
        ("<answer>6.0*4</answer>", 0.0, "bad_expression: float literal 6.0"),
        ("<answer>(6+4</answer>", 0.0, "bad_expression: does not parse (SyntaxError)"),
        ("<answer>1234567890123*2</answer>", 0.0, "bad_expression: number too large (over 12 digits)"),
        ("", 0.0, "no_answer"),  # V13: an empty response earns nothing
        ("<answer>  </answer>", 0.0, "no_answer"),
        ("I could not find one.", 0.0, "no_answer"),
    ],
)
def test_countdown_scores(response: str, score: float, reason: str | None) -> None:
    r = CountdownVerifier().verify(response, "20", **NUMS)
    assert (r.score, r.reason) == (score, reason)


def test_countdown_division_by_zero_and_exact_fractions() -> None:
    # 8 / (4 - 2*2) = 8/0 with 4, 2, 2 given once each: a division by zero, not a crash
    assert CountdownVerifier().verify("<answer>8/(4-2*2)</answer>", "20", numbers=[8, 4, 2, 2]).reason == (
        "division_by_zero"
    )
    # the classic 24 from 8, 3, 8, 3: 8 / (3 - 8/3) = 8 / (1/3) = 24 exactly; floats give 23.999999999999996
    r = CountdownVerifier().verify("<answer>8/(3-8/3)</answer>", "24", numbers=[8, 3, 8, 3])
    assert (r.score, r.parsed) == (1.0, "8/(3-8/3)")
    assert evaluate("8/(3-8/3)") == (Fraction(24), [8, 3, 8, 3])
    assert evaluate("7/2") == (Fraction(7, 2), [7, 2])  # 3.5: not 3, which would match a target of 3
    assert CountdownVerifier().verify("<answer>7/2</answer>", "3", numbers=[7, 2]).reason == "wrong"


def test_countdown_extraction_order_and_use_all() -> None:
    # the last <answer> wins over an earlier one, a box and a bare line
    assert extract_expression("<answer>1+1</answer> \\boxed{2+2}\n3+3\n<answer>4*5</answer>") == "4*5"
    assert extract_expression("\\boxed{8 \\times 2 + 4} is it") == "8 * 2 + 4"
    # no tag, no box: the last line that is only an expression (the prose line after it is skipped)
    assert extract_expression("Try: 8*2+4\n6 + 4 + 2 + 8\nthat is it") == "6 + 4 + 2 + 8"
    assert CountdownVerifier().verify("6 + 4 + 2 + 8\nthat is it", "20", **NUMS).score == 1.0  # 6+4+2+8 = 20
    # use_all: 8*2+4 = 20 leaves 6 unused
    r = CountdownVerifier(use_all=True).verify("<answer>8*2+4</answer>", "20", **NUMS)
    assert (r.score, r.reason) == (0.0, "unused_numbers: [6]")
    # (8-6)*4*2 + ... : 2*4*2 = 16 != 20 with every number once -> wrong; (8+2)*(6-4) = 20 uses all
    assert CountdownVerifier(use_all=True).verify("<answer>(8+2)*(6-4)</answer>", "20", **NUMS).score == 1.0
    assert CountdownVerifier().verify("<answer>(8+2)*(6-4)</answer>", "20", nums=[6, 4, 2, 8]).score == 1.0


def test_countdown_bad_gold_and_row() -> None:
    v = CountdownVerifier()
    assert v.verify("<answer>8*2+4</answer>", "twenty", **NUMS).reason == "bad_gold"
    assert v.verify("<answer>8*2+4</answer>", "20").reason == "bad_row: no 'numbers' list"
    bad_row = v.verify("<answer>8*2+4</answer>", "20", numbers=[8, "x"])
    assert bad_row.reason == "bad_row: 'x' in 'numbers' is not an integer"
    assert [parse_target(t) for t in (" 20 ", "-3", "20.5", "Anya")] == [20, -3, None, None]
    assert v.check_gold("20") is None and "not an integer" in v.check_gold("Anya needs to climb one floor")


# ---------------------------------------------------------------------------------------------------------
# format


@pytest.mark.parametrize(
    "response, score, reason",
    [
        ("<think>3+4=7</think> The answer is \\boxed{7}", 1.0, None),
        ("<think></think> \\boxed{7}", 0.0, "missing: think"),  # empty reasoning does not count
        ("<think>3+4</think>\\boxed{}", 0.0, "missing: boxed"),  # V13: an empty box is no answer
        ("<think>3+4 so \\boxed{7}</think>", 0.0, "missing: think, boxed"),  # box inside the reasoning only
        ("\\boxed{7}", 0.0, "missing: think, boxed"),  # no </think>: nothing counts as after it
        ("", 0.0, "missing: think, boxed"),  # V13
        ("<think>ok</think> \\boxed{7", 0.0, "missing: boxed"),  # a box cut off by the token limit
    ],
)
def test_format_think_and_boxed(response: str, score: float, reason: str | None) -> None:
    r = FormatVerifier(think=True, boxed=True).verify(response, "7")
    assert (r.score, r.reason) == (score, reason)


def test_format_single_requirements_and_args() -> None:
    assert FormatVerifier(boxed=True).verify("so \\boxed{x+1}", "").score == 1.0
    assert FormatVerifier(boxed=True).verify("so \\boxed{ }", "").reason == "missing: boxed"
    assert FormatVerifier(answer_tag=True).verify("<answer>8*2+4</answer>", "").score == 1.0
    assert FormatVerifier(answer_tag=True).verify("<answer></answer>", "").reason == "missing: answer_tag"
    r = FormatVerifier(think=True).verify("<think>a</think>B", "")
    assert (r.score, r.parsed) == (1.0, "think")
    with pytest.raises(ValueError, match="at least one"):
        FormatVerifier()


# ---------------------------------------------------------------------------------------------------------
# choice


@pytest.mark.parametrize(
    "response, score, reason, parsed",
    [
        ("Comparing them, the answer is (B).", 1.0, None, "B"),
        ("So $\\boxed{B}$", 1.0, None, "B"),
        ("Final: \\boxed{\\text{(B)}}", 1.0, None, "B"),
        ("Answer: B", 1.0, None, "B"),
        ("**Answer:** **B**", 1.0, None, "B"),
        ("The correct option is B because A is too small.", 1.0, None, "B"),  # 'because ...' is not the answer
        ("Answer: I think it is B", 1.0, None, "B"),  # I is not an option among A-E
        ("Let me see.\n(B)", 1.0, None, "B"),  # a lone letter as the last line
        ("The answer is (C).", 0.0, "wrong", "C"),
        ("the answer is (A). wait, actually the answer is (B)", 1.0, None, "B"),  # the last marker wins
        ("Answer: A or B", 0.0, "hedged", "A, B"),
        ("\\boxed{A, C}", 0.0, "hedged", "A, C"),
        ("The answer is (B) or maybe (D).", 0.0, "hedged", "B, D"),
        ("Answer: F", 0.0, "invalid_choice: F", "F"),  # 5 choices: A-E
        ("", 0.0, "no_answer", None),  # V13: the empty answer is in no sense a choice
        ("\\boxed{}", 0.0, "no_answer", None),  # V13
        ("It depends on the values.", 0.0, "no_answer", None),  # capitals inside words are not letters
    ],
)
def test_choice_scores(response: str, score: float, reason: str | None, parsed: str | None) -> None:
    r = ChoiceVerifier().verify(response, "B")
    assert (r.score, r.reason, r.parsed) == (score, reason, parsed)


def test_choice_gold_forms_and_row_choices() -> None:
    v = ChoiceVerifier()
    for gold in ("B", "(B)", "b", "B.", " B) "[1:-1]):
        assert v.verify("Answer: B", gold).score == 1.0, gold
    assert v.verify("Answer: B", "the second one").reason == "bad_gold"
    assert v.check_gold("(C)") is None and v.check_gold("F") == "gold 'F' is not one of the letters ABCDE"
    # a row with 7 options makes F and G valid
    assert v.verify("Answer: F", "F", options=["1", "2", "3", "4", "5", "6", "7"]).score == 1.0
    assert ChoiceVerifier(choices=3).verify("Answer: D", "A").reason == "invalid_choice: D"
    assert answer_letters("The answer is (A) and (C)") == ["A", "C"]
    with pytest.raises(ValueError):
        ChoiceVerifier(choices=0)


# ---------------------------------------------------------------------------------------------------------
# gsm8k


def test_gsm8k_alias_of_numeric() -> None:
    v = Gsm8kVerifier()
    assert isinstance(v, NumericVerifier)
    # a full GSM8K solution as the gold: the number after its last '####' (1,234 with a thousands comma)
    gold = "She has 1000 + 234 = <<1000+234=1234>>1234 dollars.\n#### 1,234"
    assert v.verify("So $1,234 in total.\n#### $1,234", gold).score == 1.0
    assert v.verify("#### 1234.0", "1234").score == 1.0
    r = v.verify("#### 1,23", "123")  # '1,23' is not a thousands group: the token after #### is 1
    assert (r.score, r.parsed) == (0.0, "1")
    assert v.verify("The total is 17 apples. Then 5 more.", "5").score == 1.0  # no marker: the last number
    assert v.verify("no digits here", "5").reason == "no_answer"
    assert v.check_gold("#### 42") is None
    assert v.check_gold("Anya needs to climb one floor") == "gold 'Anya needs to climb one floor' is not one number"


# ---------------------------------------------------------------------------------------------------------
# V4: percentages (policy in docs/verifiers.md)


@pytest.fixture(scope="module")
def mv() -> MathVerifier:
    return MathVerifier()


@pytest.mark.parametrize("gold", [r"$28\%$", r"28\%", "28%"])
@pytest.mark.parametrize(
    "response, math_score, numeric_score",
    [
        ("28", 1.0, 1.0),
        ("The rate is 28 percent.", 1.0, 1.0),  # both read the last number, 28
        (r"\boxed{28\%}", 1.0, 1.0),
        ("0.28", 1.0, 0.0),  # math (math-verify 0.9.0): a percent gold also equals its fraction; numeric: no
        (r"\boxed{0.28}", 1.0, 0.0),
        ("2800", 0.0, 0.0),  # not the other way round
        ("29", 0.0, 0.0),
    ],
)
def test_v4_percent_gold(mv: MathVerifier, gold: str, response: str, math_score: float, numeric_score: float) -> None:
    assert mv.verify(response, gold).score == math_score
    assert NumericVerifier().verify(response, gold).score == numeric_score


def test_v4_gold_without_percent(mv: MathVerifier) -> None:
    # gold 28: '28%' is 28 for both (the sign is a label); 0.28 is another number for both
    for response, math_score, numeric_score in [("28%", 1.0, 1.0), ("0.28", 0.0, 0.0), ("28 percent", 1.0, 1.0)]:
        assert mv.verify(response, "28").score == math_score
        assert NumericVerifier().verify(response, "28").score == numeric_score
    # gold 0.28: math-verify lets an answer's % mean /100 (28% = 0.28); numeric reads 28
    assert mv.verify(r"\boxed{28\%}", "0.28").score == 1.0
    assert NumericVerifier().verify(r"\boxed{28\%}", "0.28").score == 0.0
    # the LaTeX gold 28\% is the number 28 (was bad_gold before the one-line fix in parse_gold_number)
    assert parse_gold_number(r"$28\%$") == parse_gold_number(r"28\%") == parse_gold_number("28%") == 28.0
    assert parse_gold_number("28 percent") is None  # a word gold is not one number: rejected at load time


# ---------------------------------------------------------------------------------------------------------
# the worked custom example (verifiers/example_custom.py) and V13 for a text verifier


def test_text_answer_example_and_v13() -> None:
    v = build_verifier(VerifierSpec(name="verifiers/example_custom.py:TextAnswerVerifier"))
    gold = "golden retriever"
    assert v.verify("It is a big friendly dog.\nAnswer: The Golden  Retriever.", gold).score == 1.0
    assert v.verify("Answer: retriever", gold).reason == "wrong"  # containment would have said 1
    r = v.verify("", gold)  # V13: '' is inside every gold; an exact comparison does not reward it
    assert (r.score, r.reason) == (0.0, "no_answer")
    assert v.verify("Answer: ", gold).reason == "no_answer"
    assert v.check_gold("golden retriever") is None and v.check_gold(" . ") == "empty gold text"
    cs = TextAnswerVerifier(case_sensitive=True)
    assert cs.verify("Answer: Golden retriever", gold).reason == "wrong"


def test_function_example_is_wrapped() -> None:
    v = build_verifier(VerifierSpec(name="rlvr_verifiers.example_custom:yes_no"))
    assert v.verify("Hmm, no... yes.", "yes").score == 1.0  # the last of yes/no words is 'yes'
    r = v.verify("", "yes")
    assert (r.score, r.reason) == (0.0, "wrong")  # a False from a function becomes 0 with reason 'wrong'
    assert yes_no.check_gold("maybe") == "gold 'maybe' is not yes or no"
