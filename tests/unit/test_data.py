"""Data sources, gold extraction on the real data sets, prompt templating / tokenizing, the generated task.

Expected golds were read off the files by hand (e.g. GSM8K test row 146 ends in "#### 2,125").
"""

from __future__ import annotations

import json
import logging
import random
import re

import pytest

from rlvr.config import DataConfig, GeneratedTaskConfig
from rlvr.data import (
    build_prompts,
    format_gold,
    generated_rows,
    generated_split,
    load_rows,
    resolve_data_path,
)

GSM8K = "data/gsm8k/test.jsonl"
SVAMP = "data/svamp/test.jsonl"
MATH500 = "data/math500/test.jsonl"
CHATML = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<unk>", "<s>", "<|im_start|>", "<|im_end|>"]
WORDS = ["system", "user", "assistant", "What", "is", "7", "plus", "5", "?", "Be", "brief", "."]


@pytest.fixture(scope="module")
def tok():
    """A word-level ChatML tokenizer: one token per word / punctuation run, BOS ``<s>`` (id 1) added by default."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    inner.add_special_tokens(SPECIALS)
    inner.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<s>", eos_token="<|im_end|>", unk_token="<unk>")
    fast.chat_template = CHATML
    return fast


# ------------------------------------------------------------------------------------------------------
# real data sets


def test_gsm8k_gold_from_real_rows():
    cfg = DataConfig(source=GSM8K, question="question", answer="answer", answer_format="gsm8k")
    rows = load_rows(cfg, seed=0)
    assert len(rows) == 1319
    golds = [r["gold"] for r in rows]
    # read off the file: "#### 18", "#### 3", "#### 70000", "#### 2,125", "#### 1,450,000", "#### 14"
    assert golds[0] == "18"
    assert golds[1] == "3"
    assert golds[2] == "70000"
    assert golds[146] == "2125"
    assert golds[611] == "1450000"
    assert golds[1318] == "14"
    assert rows[0]["question"].startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert rows[0]["row"]["answer"].endswith("#### 18")  # the whole source row is kept for verifiers
    assert all(re.fullmatch(r"-?\d+", g) for g in golds)  # every GSM8K test gold is an integer


def test_svamp_template_and_float_gold():
    cfg = DataConfig(source=SVAMP, question="{Body} {Question}", answer="Answer", limit=2)
    rows = load_rows(cfg, seed=0)
    assert len(rows) == 2
    assert rows[0]["question"] == (
        "There are 87 oranges and 290 bananas in Philip's collection. If the bananas are organized into 2 "
        "groups and oranges are organized into 93 groups How big is each group of bananas?"
    )
    assert [r["gold"] for r in rows] == ["145", "19"]  # Answer 145.0, 19.0
    assert load_rows(DataConfig(source=SVAMP, question="{Body} {Question}", answer="Answer"), 0)[999]["gold"] == "91"


def test_math500_problem_answer():
    rows = load_rows(DataConfig(source=MATH500, question="problem", answer="answer"), seed=0)
    assert len(rows) == 500
    assert rows[0]["question"].startswith("Convert the point $(0,3)$ in rectangular coordinates")
    assert rows[0]["gold"] == r"\left( 3, \frac{\pi}{2} \right)"
    assert rows[2]["gold"] == r"\frac{14}{3}"
    assert rows[499]["gold"] == r"106^\circ"
    assert rows[0]["row"]["subject"] == "Precalculus"


def test_relative_path_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = load_rows(DataConfig(source=SVAMP, question="{Body} {Question}", answer="Answer", limit=1), 0)
    assert rows[0]["gold"] == "145"
    # the working directory comes first: a file at the same relative path there shadows the repo's
    (tmp_path / "data/svamp").mkdir(parents=True)
    (tmp_path / SVAMP).write_text(json.dumps({"Body": "b", "Question": "q", "Answer": 2.5}) + "\n")
    assert resolve_data_path(SVAMP) == (tmp_path / SVAMP).resolve()
    rows = load_rows(DataConfig(source=SVAMP, question="{Body} {Question}", answer="Answer"), 0)
    assert [(r["question"], r["gold"]) for r in rows] == [("b q", "2.5")]


# ------------------------------------------------------------------------------------------------------
# errors


def test_missing_answer_field_names_file_row_and_fix():
    with pytest.raises(ValueError) as e:
        load_rows(DataConfig(source=SVAMP, question="{Body} {Question}", answer="answer"), 0)
    msg = str(e.value)
    assert "svamp/test.jsonl row 0" in msg
    assert "set data.answer to one of: Answer, Question, Equation, Body, Type, ID, idx" in msg


def test_missing_template_field_names_fix():
    with pytest.raises(ValueError, match=r"no field 'Questoin'.*set data.question to one of"):
        load_rows(DataConfig(source=SVAMP, question="{Body} {Questoin}", answer="Answer"), 0)


def test_rows_without_a_gold_follow_data_bad_gold(tmp_path, caplog):
    """Issue 24 item 4: a row whose answer is null, absent, empty or lacks its '####' marker is an unusable gold
    under data.bad_gold, like a gold the verifier cannot parse (counted, the first examples logged; error mode
    names the row, its id and the key), not a stop for the whole run; a null answer is called null, not a
    missing field with the very field named as the fix. Only a key no row has stops the load (the recipe's fault)."""
    from rlvr.config import RecipeError, VerifierSpec
    from rlvr.reward.golds import check_golds

    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "a", "answer": "1", "id": "r0"}\n\n{"question": "b", "answer": " "}\n'
                    '{"question": "c", "answer": null, "id": "q-7"}\n{"question": "d"}\n{"question": "e", "answer": 5}\n')
    rows = load_rows(DataConfig(source=str(path)), 0)
    assert [(r["gold"], r.get("gold_problem")) for r in rows] == [
        ("1", None), (None, "field 'answer' is empty (data.answer)"), (None, "field 'answer' is null (data.answer)"),
        (None, "no field 'answer' in this row (data.answer)"), ("5", None)]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="rlvr.reward.golds"):
        kept, report = check_golds(rows, [VerifierSpec(name="numeric")])
    assert [r["gold"] for r in kept] == ["1", "5"] and (report.total, report.kept, len(report.bad)) == (5, 2, 3)
    assert ("3 of 5 rows have no gold verifier 'numeric' can use: row 1: no gold (field 'answer' is empty "
            "(data.answer)); row 2 (id 'q-7'): no gold (field 'answer' is null (data.answer)); row 3: no gold (no "
            "field 'answer' in this row (data.answer)). Dropped them (data.bad_gold=drop).") in caplog.text
    with pytest.raises(RecipeError) as e:
        check_golds(rows, [VerifierSpec(name="numeric")], mode="error")
    assert "row 2 (id 'q-7'): no gold (field 'answer' is null (data.answer))" in str(e.value)
    assert "data.bad_gold=error: fix data.answer" in str(e.value) and "or set data.bad_gold=drop" in str(e.value)
    (tmp_path / "plain.py").write_text("def plain(response, gold, **row):\n    return response == gold\n")
    kept, report = check_golds(rows, [VerifierSpec(name=f"{tmp_path / 'plain.py'}:plain")])
    assert [r["gold"] for r in kept] == ["1", "5"] and not report.checked  # no check_gold: rows with no gold go too
    with pytest.raises(ValueError, match=r"d\.jsonl row 0 \(counting from 0\): no field 'answr' \(data\.answer\); "
                                         r"set data\.answer to one of: question, answer, id$"):
        load_rows(DataConfig(source=str(path), answer="answr"), 0)  # no row has it: the key is wrong
    with pytest.raises(ValueError, match=r"no row's field 'answer' has the '#### ' marker .*\(row 0 included\); "
                                         r"set data\.answer_format=raw"):
        load_rows(DataConfig(source=str(path), answer_format="gsm8k"), 0)
    path.write_text('{"question": null, "answer": "1"}\n')
    with pytest.raises(ValueError, match=r"row 0 \(counting from 0\): field 'question' \(data\.question\) is null; "
                                         r"fill or remove that row$"):
        load_rows(DataConfig(source=str(path)), 0)


def test_missing_file_lists_where_it_looked():
    with pytest.raises(FileNotFoundError, match=r"data/nope\.jsonl.*looked in"):
        load_rows(DataConfig(source="data/nope.jsonl"), 0)


def test_near_source_by_hand():
    from rlvr.data.datasets import near_source

    # difflib ratio 2M/T (M matched characters, T both lengths), cutoff 0.6:
    # 'generatd' ~ 'generated': M = 8 ('generat' + 'd'), T = 17: 16/17 = 0.94
    assert near_source("generatd") == "generated"
    # not near 'generated' (the only name), so the repository's data/ folders: 'gsm8kk' ~ 'gsm8k': 10/11 = 0.91;
    # the folder holds test.jsonl and train.jsonl: the one of the split
    assert near_source("gsm8kk") == "data/gsm8k/train.jsonl"
    assert near_source("gsm8kk", split="test") == "data/gsm8k/test.jsonl"
    # 'svmap' ~ 'svamp': M = 4 ('sv', 'a' or 'm', 'p'), T = 10: 0.8; data/svamp has no train.jsonl: its one file
    assert near_source("svmap") == "data/svamp/test.jsonl"
    # a path whose folder exists: the folder's entries; 'tset.jsonl' ~ 'test.jsonl': M = 9 ('t.jsonl', 't', 'e'),
    # T = 20: 0.90 against 'train.jsonl' (0.67)
    assert near_source("data/gsm8k/tset.jsonl") == "data/gsm8k/test.jsonl"
    # names given (rlvr eval's presets): 'aime2025' ~ 'aime25': M = 6 ('aime2' + '5'), T = 14: 0.86, against
    # 'aime24': M = 5, 0.71
    assert near_source("aime2025", ["gsm8k", "aime24", "aime25"]) == "aime25"
    # nothing near: a hub id whose org folder does not exist, a word like no folder
    assert near_source("no-such/dataset-xyz") is None and near_source("zzzz") is None


def test_near_source_finds_a_data_file_in_the_working_directory_and_a_verifier_file_its_neighbour(tmp_path, monkeypatch):
    """A newcomer's typos (issue 24 frictions): a bare file name near a data file in the working directory
    ('d.jsnl' ~ 'd.jsonl': M = 6, T = 13: 0.92), and a verifier file near a .py file in its folder."""
    from rlvr.data.datasets import near_source
    from rlvr.userfiles import load_file as _load_file

    (tmp_path / "d.jsonl").write_text("{}\n")
    (tmp_path / "my_verifier.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert near_source("d.jsnl") == "d.jsonl" and near_source("zzzz") is None
    with pytest.raises(FileNotFoundError, match=r"not found \(resolved to .*\)\. Did you mean 'my_verifier\.py'\?"):
        _load_file("my_verifer.py")
    with pytest.raises(FileNotFoundError, match=r"not found \(resolved to [^)]*\)\.$"):
        _load_file("zzz.py")


def test_missing_file_names_its_nearest_neighbour():
    with pytest.raises(FileNotFoundError, match=r"fix the path\. Did you mean 'data/gsm8k/train\.jsonl'\?"):
        load_rows(DataConfig(source="data/gsm8k/trian.jsonl"), 0)


def test_bad_json_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n{"question": \n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        load_rows(DataConfig(source=str(path)), 0)


# ------------------------------------------------------------------------------------------------------
# other file types and `datasets`

ROWS = [{"question": "q0", "answer": 3.0}, {"question": "q1", "answer": "x"}, {"question": "q2", "answer": 7}]
EXPECTED = [("q0", "3"), ("q1", "x"), ("q2", "7")]


def test_json_list_columns_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "list.json").write_text(json.dumps(ROWS))
    (tmp_path / "cols.json").write_text(json.dumps({"question": ["q0", "q1"], "answer": [3.0, "x"]}))
    pq.write_table(pa.Table.from_pylist([{"question": r["question"], "answer": str(r["answer"])} for r in ROWS]),
                   tmp_path / "t.parquet")
    def got(name, **kw):
        return [(r["question"], r["gold"]) for r in load_rows(DataConfig(source=str(tmp_path / name), **kw), 0)]

    assert got("list.json") == EXPECTED
    assert got("cols.json") == EXPECTED[:2]
    assert got("t.parquet") == [("q0", "3.0"), ("q1", "x"), ("q2", "7")]  # a string "3.0" stays as written
    assert got("list.json", limit=1) == EXPECTED[:1]


def test_datasets_folder_and_unknown_name(tmp_path, monkeypatch):
    import datasets.config

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # load_rows sets them: restore them afterwards
        monkeypatch.setattr(datasets.config, flag, getattr(datasets.config, flag))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder/train.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    rows = load_rows(DataConfig(source=str(tmp_path / "folder"), split="train", limit=2), 0)
    assert [(r["question"], r["gold"]) for r in rows] == EXPECTED[:2]
    with pytest.raises(ValueError, match=r"'no-such/dataset-xyz'.*could not load it") as ei:
        load_rows(DataConfig(source="no-such/dataset-xyz"), 0)
    assert "Did you mean" not in str(ei.value)
    with pytest.raises(ValueError, match=r"could not load it.* Did you mean 'generated'\?$"):
        load_rows(DataConfig(source="generatd"), 0)


def test_format_gold():
    assert format_gold(5.0) == "5"
    assert format_gold(-12.0) == "-12"
    assert format_gold(2.5) == "2.5"
    assert format_gold(145) == "145"
    assert format_gold(["$3$"]) == "$3$"
    assert format_gold([1, 2.0]) == "1, 2"
    assert format_gold(" 7\n") == "7"


# ------------------------------------------------------------------------------------------------------
# prompts


def _rows(*questions: str) -> list[dict]:
    return [{"question": q, "gold": "1", "row": {"i": i}} for i, q in enumerate(questions)]


def test_chat_template_single_bos(tok):
    cfg = DataConfig(source="x")
    (p,), dropped = build_prompts(_rows("What is 7 plus 5?"), tok, cfg)
    assert dropped == 0
    assert p.text == "<s><|im_start|>user\nWhat is 7 plus 5?<|im_end|>\n<|im_start|>assistant\n"
    v = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    assert p.prompt_ids == [v[t] for t in ["<s>", "<|im_start|>", "user", "What", "is", "7", "plus", "5", "?",
                                          "<|im_end|>", "<|im_start|>", "assistant"]]
    assert p.prompt_ids.count(1) == 1  # BOS once (tokenizing with special tokens would prepend a second)
    assert (p.index, p.gold, p.row) == (0, "1", {"i": 0})


def test_system_prompt_and_literal_braces(tok):
    cfg = DataConfig(source="x", system_prompt="Be brief.",
                     prompt_template="{question} Put your final answer within \\boxed{}.")
    (p,), _ = build_prompts(_rows("Is {x} = {question}?"), tok, cfg)
    assert p.text == (
        "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
        "Is {x} = {question}? Put your final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_raw_text_gets_one_bos(tok):
    cfg = DataConfig(source="x", chat_template=False, prompt_template="Q: {question}")
    (p,), _ = build_prompts(_rows("What is 7 plus 5?"), tok, cfg)
    assert p.text == "Q: What is 7 plus 5?"
    assert p.prompt_ids[0] == 1 and p.prompt_ids.count(1) == 1
    assert len(p.prompt_ids) == 1 + 8  # <s> Q : What is 7 plus 5 ?


def test_length_filter_count_exact(tok, caplog):
    # chat prompt = 6 fixed tokens (<s> <|im_start|> user <|im_end|> <|im_start|> assistant) + n question words
    ns = [5, 1, 4, 2, 6, 3]
    rows = _rows(*[" ".join(["plus"] * n) for n in ns])
    with caplog.at_level(logging.WARNING, logger="rlvr.data.datasets"):
        prompts, dropped = build_prompts(rows, tok, DataConfig(source="x", max_prompt_tokens=9))
    assert dropped == 3  # n = 5, 4, 6 give 11, 10, 12 tokens > 9
    assert [p.index for p in prompts] == [1, 3, 5]  # positions in the loaded list
    assert [len(p.prompt_ids) for p in prompts] == [7, 8, 9]  # 9 == max is kept
    assert "dropped 3 of 6 prompts" in caplog.text
    prompts, dropped = build_prompts(rows, tok, DataConfig(source="x", max_prompt_tokens=12))
    assert (len(prompts), dropped) == (6, 0)
    with pytest.raises(ValueError, match=r"data.max_prompt_tokens >= 7"):
        build_prompts(rows, tok, DataConfig(source="x", max_prompt_tokens=6))


def test_all_too_long_advice_stays_within_the_context(tok):
    """Issue 24 item 1: "set data.max_prompt_tokens >= 637" on a 512-token model led the run into the engine's
    context error. With the context known (its size, rollout.max_new_tokens), the advice fits in it. Prompts of 7
    to 12 tokens (6 fixed + n words), max 6: all too long, the shortest 7."""
    rows = _rows(*[" ".join(["plus"] * n) for n in (1, 3, 6)])

    def advice(context):
        with pytest.raises(ValueError) as e:
            build_prompts(rows, tok, DataConfig(source="x", max_prompt_tokens=6), context)
        return str(e.value).removeprefix("all 3 prompts are longer than data.max_prompt_tokens=6; ")

    assert advice((16, 4)) == ("set data.max_prompt_tokens >= 7 (at most 12: the model's 16-token context less "
                               "rollout.max_new_tokens=4)")
    assert advice((16, 12)) == ("the shortest (7 tokens) fits the model's 16-token context beside at most 9 new "
                                "tokens, not rollout.max_new_tokens=12: lower rollout.max_new_tokens to 9 or less and "
                                "set data.max_prompt_tokens >= 7, or shorten the prompts (data.prompt_template, "
                                "data.system_prompt, the questions)")
    assert advice((7, 2)) == ("the shortest (7 tokens) leaves no room for a response in the model's 7-token context: "
                              "shorten the prompts (data.prompt_template, data.system_prompt, the questions), or use "
                              "a model with a longer context")
    assert advice(None) == "set data.max_prompt_tokens >= 7"  # context unknown: as before
    # a multi-turn run: what follows the prompt is environment.max_tokens, named as such (a new user was told
    # "rollout.max_new_tokens=256" of a recipe whose rollout.max_new_tokens was 64)
    assert advice((16, 4, "environment.max_tokens")) == ("set data.max_prompt_tokens >= 7 (at most 12: the model's "
                                                         "16-token context less environment.max_tokens=4)")
    assert "lower environment.max_tokens to 9 or less" in advice((16, 12, "environment.max_tokens"))


def test_no_chat_template_is_a_clear_error(tok):
    import copy

    bare = copy.deepcopy(tok)
    bare.chat_template = None
    with pytest.raises(ValueError, match="data.chat_template=false"):
        build_prompts(_rows("What is 7 plus 5?"), bare, DataConfig(source="x"))


# ------------------------------------------------------------------------------------------------------
# the generated task

# random.Random(0).random() draws, in order (Python's guaranteed stream); three per row: op, a, b
DRAWS0 = [0.8444218515250481, 0.7579544029403025, 0.420571580830845, 0.25891675029296335,
          0.5112747213686085, 0.4049341374504143, 0.7837985890347726, 0.30331272607892745, 0.4765969541523558]


def _qa(rows):
    return [(r["question"], r["answer"]) for r in rows]


def test_generated_rows_by_hand():
    r = random.Random(0)
    assert [r.random() for _ in DRAWS0] == DRAWS0
    # one digit: a = floor(10 u): (7, 4), (5, 4), (3, 4)
    assert _qa(generated_rows(GeneratedTaskConfig(ops=("plus",), size=3), 0)) == [
        ("What is 7 plus 4?", "11"), ("What is 5 plus 4?", "9"), ("What is 3 plus 4?", "7")]
    # op = ops[floor(3 u1)]: 0.844 -> times, 0.259 -> plus, 0.784 -> times
    assert _qa(generated_rows(GeneratedTaskConfig(ops=("plus", "minus", "times"), size=3), 0)) == [
        ("What is 7 times 4?", "28"), ("What is 5 plus 4?", "9"), ("What is 3 times 4?", "12")]
    # minus puts the larger first: (3, 4) -> 4 minus 3
    assert _qa(generated_rows(GeneratedTaskConfig(ops=("minus",), size=3), 0))[2] == ("What is 4 minus 3?", "1")
    # two digits: a = 10 + floor(90 u): 10 + 68 = 78, 10 + 37 = 47
    assert _qa(generated_rows(GeneratedTaskConfig(digits=2, size=1), 0)) == [("What is 78 plus 47?", "125")]


def test_generated_properties():
    cfg = GeneratedTaskConfig(ops=("plus", "minus", "times"), digits=2, size=2000)
    rows = generated_rows(cfg, 3)
    assert rows == generated_rows(cfg, 3)
    assert _qa(rows) != _qa(generated_rows(cfg, 4))
    assert {r["op"] for r in rows} == {"plus", "minus", "times"}
    for r in rows:
        a, op, b = re.fullmatch(r"What is (\d+) (plus|minus|times) (\d+)\?", r["question"]).groups()
        a, b = int(a), int(b)
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert r["answer"] == str({"plus": a + b, "minus": a - b, "times": a * b}[op])
        assert int(r["answer"]) >= 0


def test_generated_holdout_split_and_load_rows():
    gen = GeneratedTaskConfig(ops=("plus", "times"), size=10, holdout=3)
    every = generated_rows(gen, 5)
    assert generated_split(gen, 5, "train") == every[:7]
    assert generated_split(gen, 5, "holdout") == every[7:]
    rows = load_rows(DataConfig(source="generated", generated=gen), 5)
    assert [(r["question"], r["gold"]) for r in rows] == _qa(every[:7])
    held = load_rows(DataConfig(source="generated", generated=gen, split="holdout", limit=2), 5)
    assert [(r["question"], r["gold"]) for r in held] == _qa(every[7:9])
    with pytest.raises(ValueError, match="data.generated.holdout=10"):
        generated_rows(GeneratedTaskConfig(size=10, holdout=10), 0)
    with pytest.raises(ValueError, match="choose from"):
        generated_rows(GeneratedTaskConfig(ops=("divide",)), 0)


def test_generated_holdout_by_question_never_trains_on_a_held_out_question(caplog):
    """Worked by hand from the rows of (plus, one digit, size 40, seed 5): rows 22-39 are held out and ask 17
    distinct questions (0+1 at rows 22 and 31); of training rows 0-21, rows 0 (7+7), 3 (9+1), 4 (2+5), 12 (9+6),
    15 (3+6) and 19 (9+0) ask held-out questions and are dropped, 16 rows left."""
    every = generated_rows(GeneratedTaskConfig(ops=("plus",), size=40, holdout=18), 5)
    by_row = GeneratedTaskConfig(ops=("plus",), size=40, holdout=18)
    by_q = GeneratedTaskConfig(ops=("plus",), size=40, holdout=18, holdout_by="question")
    assert generated_split(by_row, 5, "train") == every[:22]  # the default: by position, 0+1 also trained on
    held = generated_split(by_q, 5, "holdout")
    assert held == [every[i] for i in range(22, 40) if i != 31]
    assert [(r["a"], r["b"]) for r in held[:4]] == [(0, 1), (1, 7), (9, 3), (5, 7)]
    train = generated_split(by_q, 5, "train")
    assert train == [every[i] for i in (1, 2, 5, 6, 7, 8, 9, 10, 11, 13, 14, 16, 17, 18, 20, 21)]
    with caplog.at_level("INFO", logger="rlvr.data.datasets"):
        rows = load_rows(DataConfig(source="generated", generated=by_q), 5)
    assert len(rows) == 16 and "6 of 22 training rows dropped" in caplog.text
    # seed 33's two rows both ask 6 plus 8: holding out the second leaves no training row
    lone = GeneratedTaskConfig(ops=("plus",), size=2, holdout=1, holdout_by="question")
    assert [r["question"] for r in generated_rows(lone, 33)] == ["What is 6 plus 8?"] * 2
    with pytest.raises(ValueError, match="all 1 training rows ask held-out questions"):
        generated_split(lone, 33, "train")


def test_openings_with_tool_turns_and_no_tools_are_warned(tok, caplog):
    """A row opening with worked tool calls (recipes/tools_cpu.yaml's data) used without tools: the model writes calls
    nobody answers (a new user's `rlvr eval ... --tools none` scored 0 with no word why); one warning with the
    count. Rows without tool turns: no warning."""
    shot = [{"role": "user", "content": "2*3?"}, {"role": "assistant", "content": "<tool_call>...</tool_call>"},
            {"role": "tool", "content": "6"}, {"role": "assistant", "content": "6"}, {"role": "user", "content": "q"}]
    rows = [{"question": "q", "gold": "1", "row": {"messages": shot}}, *_rows("What is 7 plus 5?")]
    with caplog.at_level("WARNING", logger="rlvr.data.datasets"):
        build_prompts(rows, tok, DataConfig(source="x"))
    assert "1 of 2 rows open with tool messages" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlvr.data.datasets"):
        build_prompts(_rows("What is 7 plus 5?"), tok, DataConfig(source="x"))
    assert "tool messages" not in caplog.text
