"""Data sets -> rows (question, gold) -> templated, tokenized, length-filtered prompts.

Sources (``data.source``): ``generated`` (:mod:`rlvr.data.generated`), a local ``.jsonl`` / ``.json`` /
``.parquet`` file or a folder ``datasets`` can load, or a ``datasets`` name (``name`` or ``name:config``, e.g.
``openai/gsm8k:main``; offline when the hub cannot be reached). Relative paths are looked up in the working
directory, then in the repository that holds the ``rlvr`` package (so ``data/svamp/test.jsonl`` works from any
folder with an editable install): see :func:`resolve_data_path`.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlvr.config import ENV_SOURCE, DataConfig
from rlvr.types import Prompt

log = logging.getLogger(__name__)

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
PACKAGE_DIR = Path(__file__).resolve().parent.parent
"""The ``rlvr`` package folder; its parent is the repository root (an editable install)."""
_FIELD = re.compile(r"\{([^{}]+)\}")
ID_FIELDS = ("id", "ID", "unique_id", "task_id", "idx")
"""Row fields read as a problem's id (the first one present): named in load errors, copied by ``rlvr eval``."""


# ------------------------------------------------------------------------------------------------------
# locating and reading sources


def search_dirs() -> list[Path]:
    """Folders a relative ``data.source`` is looked up in, in order: working directory, repo root, package."""
    return [Path.cwd(), PACKAGE_DIR.parent, PACKAGE_DIR]


def resolve_data_path(source: str) -> Path | None:
    """The existing file or folder ``source`` names, or None if it names none (then it may be a hub name).

    Absolute paths (and ``~``) are taken as they are; relative ones are tried against :func:`search_dirs`.
    """
    path = Path(source).expanduser()
    if path.is_absolute():
        return path if path.exists() else None
    for base in search_dirs():
        if (base / path).exists():
            return (base / path).resolve()
    return None


def near_source(source: str, names: Sequence[str] = ("generated",), split: str = "train") -> str | None:
    """What a data source that names nothing was likely meant to be, or None (difflib's nearest at its default
    cutoff 0.6, as :mod:`rlvr.config` suggests keys):

    - a path whose folder exists (``data/gsm8k/tset.jsonl``): the nearest entry of that folder, written as the
      source was (``data/gsm8k/test.jsonl``);
    - a bare name: the nearest of ``names`` (a recipe: ``generated``; ``rlvr eval``: its presets), else of the data
      files in the working directory (``d.jsnl`` -> ``d.jsonl``), else of the repository's ``data/`` folders (``gsm8kk`` -> ``data/gsm8k/train.jsonl``: the folder's ``<split>.jsonl``,
      else its first data file).
    """
    path = Path(source).expanduser()
    if len(path.parts) > 1:
        parent = resolve_data_path(str(path.parent))
        if parent is None or not parent.is_dir():
            return None
        near = difflib.get_close_matches(path.name, sorted(p.name for p in parent.iterdir()), n=1)
        return str(path.parent / near[0]) if near else None
    near = difflib.get_close_matches(source, list(names), n=1)
    if near:
        return near[0]
    here = sorted(p.name for p in Path.cwd().iterdir() if p.suffix in FILE_SUFFIXES and p.is_file())
    near = difflib.get_close_matches(source, here, n=1)  # a data file in the working directory (d.jsnl -> d.jsonl)
    if near:
        return near[0]
    root = PACKAGE_DIR.parent / "data"
    folders = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    near = difflib.get_close_matches(source, folders, n=1)
    if not near:
        return None
    files = sorted(p.name for p in (root / near[0]).iterdir() if p.suffix in FILE_SUFFIXES)
    pick = f"{split}.jsonl" if f"{split}.jsonl" in files else (files[0] if files else "")
    return (Path(root.name) / near[0] / pick).as_posix()  # "data/<folder>/<file>", or the folder when it has none


def did_you_mean(source: str, names: Sequence[str] = ("generated",), split: str = "train") -> str:
    """``" Did you mean 'X'?"`` for :func:`near_source`'s answer, ``""`` when it has none (to end an error message)."""
    near = near_source(source, names, split)
    return f" Did you mean {near!r}?" if near else ""


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {line_no} is not valid JSON ({e}); fix or remove that line") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}: line {line_no} is a {type(row).__name__}, not a JSON object of fields")
            rows.append(row)
    return rows


def _read_json(path: Path) -> list[dict[str, Any]]:
    """A list of row objects, or an object of equal-length columns (``{"question": [...], "answer": [...]}``)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        lengths = {len(v) for v in data.values()}
        if len(lengths) == 1:
            n = lengths.pop()
            return [{k: v[i] for k, v in data.items()} for i in range(n)]
    if isinstance(data, list) and all(isinstance(r, dict) for r in data):
        return data
    raise ValueError(
        f"{path}: expected a JSON list of row objects or an object of equal-length columns; "
        "for one object a line use a .jsonl file"
    )


def _read_file(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    if path.suffix == ".json":
        return _read_json(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # installed with `datasets`

        return pq.read_table(path).to_pylist()
    raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(FILE_SUFFIXES)}")


def hub_reachable(timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to the Hugging Face hub (``HF_ENDPOINT``) opens within ``timeout_s`` seconds."""
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def _go_offline_without_network() -> None:
    """Load offline when ``HF_DATASETS_OFFLINE`` / ``HF_HUB_OFFLINE`` say so or, unset, the hub is unreachable.

    Sets ``HF_DATASETS_OFFLINE=1`` and patches ``datasets.config``, which reads the flags once at import.
    """
    flag = os.environ.get("HF_DATASETS_OFFLINE") or os.environ.get("HF_HUB_OFFLINE")
    offline = flag.strip().upper() in ("1", "ON", "YES", "TRUE") if flag else not hub_reachable()
    if not offline:
        return
    if not flag:
        log.info("the Hugging Face hub is unreachable: loading data sets offline (HF_DATASETS_OFFLINE=1)")
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets.config

    datasets.config.HF_HUB_OFFLINE = True
    datasets.config.HF_DATASETS_OFFLINE = True


def _read_datasets(name: str, split: str, limit: int | None) -> list[dict[str, Any]]:
    """Rows of a ``datasets`` name (``name`` or ``name:config``) or a local folder it can load."""
    _go_offline_without_network()
    import datasets

    config = None
    if ":" in name and not Path(name).exists():
        name, config = name.split(":", 1)
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # noqa: BLE001 - many causes (offline, no such name, no such split): one message
        tried = ", ".join(str(d / name) for d in search_dirs())
        raise ValueError(
            f"data.source={name!r}{f' (config {config!r})' if config else ''} split {split!r}: not a local file "
            f"(looked in {tried}) and `datasets` could not load it: {type(e).__name__}: {e}. Fix: give the path "
            f"of a {'/'.join(FILE_SUFFIXES)} file, or a data set name in the local `datasets` cache."
            f"{did_you_mean(name, split=split)}"
        ) from e
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return ds.to_list()


# ------------------------------------------------------------------------------------------------------
# rows -> question and gold


def format_gold(value: Any) -> str:
    """A gold value as text: ``5.0`` -> ``"5"``, ``2.5`` -> ``"2.5"``, ``["3"]`` -> ``"3"``, strings stripped.

    Lists of several answers are joined with ``", "``.
    """
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return ", ".join(format_gold(v) for v in value)
    return str(value).strip()


def gsm8k_gold(answer: str) -> str | None:
    """GSM8K gold: the text after the last ``#### `` with thousands commas removed (``"2,125"`` -> ``"2125"``).

    None when the answer has no ``#### `` marker.
    """
    if "#### " not in answer:
        return None
    return answer.rsplit("#### ", 1)[1].strip().replace(",", "")


def row_id(row: dict[str, Any]) -> Any:
    """The row's id (the first of :data:`ID_FIELDS` it has), None when it has none."""
    return next((row[f] for f in ID_FIELDS if f in row), None)


def _missing(where: str, field: str, key: str, row: dict[str, Any]) -> ValueError:
    """The error for a field a row lacks (``data.<key>`` names it) or holds null, naming the fix."""
    if field in row:  # present, but null: naming the fields would offer the very one it calls missing
        return ValueError(f"{where}: field {field!r} (data.{key}) is null; fill or remove that row")
    return ValueError(
        f"{where}: no field {field!r} (data.{key}); set data.{key} to one of: {', '.join(map(str, row))}"
        + (" (or a template over them, e.g. '{Body} {Question}')" if key == "question" else "")
    )


def row_messages(row: dict[str, Any], where: str = "a data row") -> list[dict[str, str]] | None:
    """A row's own opening conversation: its ``messages`` field (Hugging Face chat format: a list of
    ``{"role", "content"}``, system / user / assistant turns), used as is; None when the row has none.

    Errors: ``ValueError`` naming ``where`` when ``messages`` is not such a list or has no user message."""
    msgs = row.get("messages")
    if msgs is None:
        return None
    ok = isinstance(msgs, list) and msgs and all(
        isinstance(m, dict) and m.get("role") in ("system", "user", "assistant", "tool")
        and isinstance(m.get("content"), str) for m in msgs)  # fmt: skip
    if not ok or not any(m["role"] == "user" for m in msgs):
        raise ValueError(f"{where}: field 'messages' must be a list of {{role, content}} chat messages with at least "
                         f"one user message (got {str(msgs)[:120]!r}); fix the row or drop the field")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def _question(row: dict[str, Any], spec: str, where: str) -> str:
    msgs = row_messages(row, where)
    if msgs is not None and ("{" in spec or row.get(spec) is None):  # the question shown: the last user message
        return next(m["content"] for m in reversed(msgs) if m["role"] == "user")
    if "{" not in spec:
        if row.get(spec) is None:
            raise _missing(where, spec, "question", row)
        return str(row[spec])

    def field(m: re.Match[str]) -> str:
        if row.get(m.group(1)) is None:
            raise _missing(where, m.group(1), "question", row)
        return str(row[m.group(1)])

    return _FIELD.sub(field, spec)


def gold_problem(row: dict[str, Any], cfg: DataConfig) -> tuple[str | None, str | None]:
    """(gold, None) for a row whose gold reads as ``cfg.answer`` / ``cfg.answer_format`` say, else (None, why):
    the field absent from the row, null, empty, or without the ``#### `` marker ``answer_format: gsm8k`` needs;
    each reason names the recipe key."""
    if cfg.answer not in row:
        return None, f"no field {cfg.answer!r} in this row (data.answer)"
    value = row[cfg.answer]
    if value is None:
        return None, f"field {cfg.answer!r} is null (data.answer)"
    if cfg.answer_format == "gsm8k":
        gold = gsm8k_gold(str(value))
        if gold is None:
            return None, f"field {cfg.answer!r} has no '#### ' marker (data.answer_format=gsm8k)"
    else:
        gold = format_gold(value)
    if not gold:
        return None, f"field {cfg.answer!r} is empty (data.answer)"
    return gold, None


def load_rows(cfg: DataConfig, seed: int) -> list[dict[str, Any]]:
    """The first ``cfg.limit`` rows of ``cfg.source`` as ``{"question": str, "gold": str, "row": dict}``.

    ``question`` comes from ``cfg.question`` (a field, or a template such as ``"{Body} {Question}"``), ``gold``
    from ``cfg.answer`` read as ``cfg.answer_format``; ``row`` is the source row itself (every field).
    A row whose gold cannot be read (:func:`gold_problem`: the field absent from that row, null, empty, or
    without its ``####`` marker) has ``gold`` None and ``gold_problem`` (why, naming the key): it is one of the
    unusable golds :func:`rlvr.reward.golds.check_golds` drops or refuses under ``data.bad_gold``.
    ``generated``: the training rows of :func:`rlvr.data.generated.generated_split` for ``seed``, or its
    holdout rows when ``cfg.split`` is ``holdout``, ``test`` or ``validation`` (``data.question``,
    ``data.answer`` and ``data.answer_format`` do not apply to it). ``seed`` is used by ``generated`` only.

    Errors: ``FileNotFoundError`` for a file path that exists nowhere (the message lists where it looked);
    ``ValueError`` naming the file, the row (counting from 0) and the key to set for a question field a row
    lacks or holds null, an answer field no row has, a ``####`` marker no row has (``answer_format: gsm8k``),
    malformed JSON, or a source ``datasets`` cannot load.
    """
    if cfg.limit is not None and cfg.limit < 1:
        raise ValueError(f"data.limit={cfg.limit}: must be >= 1 (or null for all rows)")
    if cfg.source == "generated":
        return _generated(cfg, seed)
    if cfg.source.startswith(REASONING_GYM):
        return _reasoning_gym(cfg, seed)
    if cfg.source.startswith(ENV_SOURCE):
        return _env_rows(cfg, seed)
    path = resolve_data_path(cfg.source)
    if path is None and cfg.source.endswith(FILE_SUFFIXES):
        tried = ", ".join(str(d / cfg.source) for d in search_dirs())
        raise FileNotFoundError(f"data.source={cfg.source!r} not found (looked in: {tried}); fix the path."
                                f"{did_you_mean(cfg.source, split=cfg.split)}")
    if path is not None and path.is_file():
        raw, name = _read_file(path), str(path)
    else:
        raw, name = _read_datasets(str(path or cfg.source), cfg.split, cfg.limit), f"{cfg.source} [{cfg.split}]"
    if cfg.limit is not None:
        raw = raw[: cfg.limit]
    if not raw:
        raise ValueError(f"{name}: no rows")
    if not any(cfg.answer in row for row in raw):  # no row has the field: the key is wrong, not the data
        raise _missing(f"{name} row 0 (counting from 0)", cfg.answer, "answer", raw[0])
    rows = []
    for i, row in enumerate(raw):
        where = f"{name} row {i} (counting from 0)"
        gold, problem = gold_problem(row, cfg)
        rows.append({"question": _question(row, cfg.question, where), "gold": gold, "row": row}
                    | ({"gold_problem": problem} if problem else {}))
    no_marker = ["marker" in r.get("gold_problem", "") for r in rows]
    if cfg.answer_format == "gsm8k" and any(no_marker) and all(r["gold"] is None for r in rows):
        raise ValueError(f"{name}: no row's field {cfg.answer!r} has the '#### ' marker data.answer_format=gsm8k "
                         f"reads (row {no_marker.index(True)} included); set data.answer_format=raw if the field "
                         "holds the answer itself")
    return rows


REASONING_GYM = "reasoning_gym:"
"""The prefix of a reasoning-gym source: ``reasoning_gym:<task>``."""


def _reasoning_gym(cfg: DataConfig, seed: int) -> list[dict[str, Any]]:
    """Rows of the reasoning-gym task ``cfg.source`` names (``data.reasoning_gym``: args, size, holdout; seeded by
    ``seed``): ``question`` and ``answer`` as the task gives them, its ``metadata`` in the row (what the
    ``reasoning_gym`` verifier scores with). Each row's own answer is scored by the task's scorer: one that does
    not score 1 is a bad gold (``gold_problem``). Errors: ``ImportError`` without the package (the fix named);
    ``ValueError`` for an unknown task (the nearest named), args the task refuses, or sizes that leave no rows."""
    import difflib

    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError as e:
        raise ImportError(f"data.source={cfg.source!r} needs reasoning-gym: pip install 'rlvr[envs]' (or "
                          f"reasoning-gym==0.1.25) ({e})") from e  # fmt: skip
    task, rg = cfg.source[len(REASONING_GYM):], cfg.reasoning_gym
    if task not in DATASETS:
        near = difflib.get_close_matches(task, sorted(DATASETS), n=3)
        raise ValueError(f"data.source={cfg.source!r}: reasoning-gym has no task {task!r}"
                         + (f"; did you mean {', '.join(REASONING_GYM + n for n in near)}?" if near else
                            f" ({len(DATASETS)} tasks: reasoning_gym.factory.DATASETS)"))  # fmt: skip
    if not 0 <= rg.holdout < rg.size:
        raise ValueError(f"data.reasoning_gym: holdout={rg.holdout} must be >= 0 and < size={rg.size}")
    try:
        ds = reasoning_gym.create_dataset(task, size=rg.size, seed=seed, **rg.args)
    except (TypeError, ValueError, AssertionError) as e:
        raise ValueError(f"data.reasoning_gym.args={rg.args!r} for task {task!r}: {type(e).__name__}: {e}") from e
    if cfg.split == "train":
        idx = range(rg.size - rg.holdout)
    elif cfg.split in ("holdout", "test", "validation"):
        if not rg.holdout:
            raise ValueError("data.split=holdout but data.reasoning_gym.holdout=0: set data.reasoning_gym.holdout > 0")
        idx = range(rg.size - rg.holdout, rg.size)
    else:
        raise ValueError(f"data.split={cfg.split!r} for a reasoning_gym source: use train or holdout")
    score = reasoning_gym.get_score_answer_fn(task)
    rows = []
    for i in (list(idx)[: cfg.limit] if cfg.limit is not None else idx):
        e = ds[i]
        row = {"question": e["question"], "answer": format_gold(e["answer"]), "metadata": e["metadata"]}
        own = float(score(e["answer"], e))
        problem = None if own == 1.0 else f"the task's own answer scores {own:g} under its scorer, not 1"
        rows.append({"question": e["question"], "gold": row["answer"] if problem is None else None, "row": row}
                    | ({"gold_problem": problem} if problem else {}))
    return rows


def _env_rows(cfg: DataConfig, seed: int) -> list[dict[str, Any]]:
    """Rows an environment makes (``data.source: env:<environment>``, ``data.env_rows``: args, size, holdout): the
    environment class's ``rows(size=size, seed=seed, **args)``, a list of JSON-able dicts, each with ``question``
    (the text the prompt template takes; may be "" when the environment's ``reset`` gives the opening) and
    optionally ``answer`` (a gold for answer-checking verifiers; "" or absent for environment-scored tasks) and
    ``messages`` (the row's opening conversation). The last ``holdout`` rows are the held-out split.

    Errors: those of :func:`rlvr.envs.runner.resolve_environment`; ``TypeError`` for a class without ``rows`` or
    args it does not take; ``ValueError`` for bad sizes or rows that are not dicts with a string ``question``."""
    from rlvr.envs.runner import resolve_environment
    from rlvr.registry import check_kwargs

    name, er = cfg.source[len(ENV_SOURCE):], cfg.env_rows
    cls = resolve_environment(name)
    make = getattr(cls, "rows", None)
    if not callable(make):
        raise TypeError(f"data.source={cfg.source!r}: the environment {name!r} has no rows(size, seed, **args) "
                        "classmethod, so it makes no rows; give the rows as a file (data.source: rows.jsonl)")
    if not 0 <= er.holdout < er.size:
        raise ValueError(f"data.env_rows: holdout={er.holdout} must be >= 0 and < size={er.size}")
    check_kwargs(make, {"size": er.size, "seed": seed, **er.args}, "data.env_rows.args")
    made = list(make(size=er.size, seed=seed, **er.args))
    if len(made) != er.size:
        raise ValueError(f"data.source={cfg.source!r}: {name}.rows made {len(made)} rows for size={er.size}")
    if cfg.split == "train":
        made = made[: er.size - er.holdout]
    elif cfg.split in ("holdout", "test", "validation"):
        if not er.holdout:
            raise ValueError("data.split=holdout but data.env_rows.holdout=0: set data.env_rows.holdout > 0")
        made = made[er.size - er.holdout:]
    else:
        raise ValueError(f"data.split={cfg.split!r} for an env: source: use train or holdout")
    rows = []
    for i, row in enumerate(made[: cfg.limit] if cfg.limit is not None else made):
        if not isinstance(row, dict) or not isinstance(row.get("question"), str):
            raise ValueError(f"data.source={cfg.source!r}: row {i} from {name}.rows is {str(row)[:120]!r}; each row "
                             "is a dict with a string 'question'")
        answer = row.get("answer")
        rows.append({"question": row["question"], "gold": "" if answer is None else str(answer), "row": row})
    return rows


def _generated(cfg: DataConfig, seed: int) -> list[dict[str, Any]]:
    from rlvr.data.generated import generated_split

    if cfg.split == "train":
        part = "train"
    elif cfg.split in ("holdout", "test", "validation"):
        part = "holdout"
    else:
        raise ValueError(f"data.split={cfg.split!r} for data.source=generated: use train or holdout")
    gen = generated_split(cfg.generated, seed, part)  # type: ignore[arg-type]
    if part == "train" and cfg.generated.holdout_by == "question" and cfg.generated.holdout:
        log.info("data.generated.holdout_by=question: %d of %d training rows dropped (they ask held-out questions)",
                 cfg.generated.size - cfg.generated.holdout - len(gen), cfg.generated.size - cfg.generated.holdout)
    if not gen:
        raise ValueError("data.split=holdout but data.generated.holdout=0: set data.generated.holdout > 0")
    gen = gen[: cfg.limit] if cfg.limit is not None else gen
    return [{"question": r["question"], "gold": r["answer"], "row": r} for r in gen]


# ------------------------------------------------------------------------------------------------------
# the chat template (data.chat_template_path)


def chat_template_text(value: str) -> str:
    """The Jinja source ``value`` (``data.chat_template_path``) names: a template shipped in rlvr
    (:data:`rlvr.data.chat_templates.BUILTIN`), else a file (``~`` expanded; a relative path is tried as data files
    are: :func:`resolve_data_path`). A file is parsed here, so a syntax error is found at load.

    Errors: :class:`~rlvr.config.RecipeError` naming ``data.chat_template_path``: no such name or file (the nearest
    shipped name when one is near), a file that cannot be read, a template that does not parse (its line)."""
    import jinja2

    from rlvr.config import RecipeError
    from rlvr.data.chat_templates import BUILTIN, KEY

    if value in BUILTIN:
        return BUILTIN[value]
    path = resolve_data_path(value)
    if path is None or not path.is_file():
        near = difflib.get_close_matches(value, list(BUILTIN), n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise RecipeError(f"{KEY}={value!r}: no such file and not a template shipped in rlvr ({', '.join(BUILTIN)}); "
                          f"give a Jinja file's path (relative paths are tried from the working directory, then from "
                          f"the rlvr repository) or one of those names.{hint}")
    try:
        return _read_template(str(path), path.stat().st_mtime_ns)
    except (OSError, UnicodeDecodeError) as e:
        raise RecipeError(f"{KEY}={value!r}: cannot read {path}: {e}") from None
    except jinja2.TemplateSyntaxError as e:
        raise RecipeError(f"{KEY}={value!r}: {path} line {e.lineno} is not valid Jinja: {e.message}") from None


@functools.lru_cache(maxsize=8)
def _read_template(path: str, mtime_ns: int) -> str:
    """The file's text, parsed once as Jinja (prompts are rendered per row: a file is read once per change)."""
    import jinja2

    text = Path(path).read_text(encoding="utf-8")
    jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
    return text


def with_chat_template(tokenizer: Any, cfg: DataConfig) -> Any:
    """``tokenizer`` with the run's chat template: ``cfg.chat_template_path``'s (:func:`chat_template_text`) set as
    its ``chat_template`` (in place, so every later rendering and ``save_pretrained`` use it), or unchanged when the
    key is None (its own). Returns ``tokenizer``. Errors: those of :func:`chat_template_text`."""
    if cfg.chat_template_path is not None:
        tokenizer.chat_template = chat_template_text(cfg.chat_template_path)
    return tokenizer


# ------------------------------------------------------------------------------------------------------
# rows -> prompts


def render_prompt(question: str, tokenizer: Any, cfg: DataConfig) -> str:
    """The full prompt text for one question.

    ``cfg.prompt_template`` with ``{question}`` replaced literally (questions hold braces: no ``str.format``),
    then the run's chat template (the tokenizer's, or ``cfg.chat_template_path``'s, set on ``tokenizer``:
    :func:`with_chat_template`; system message if ``cfg.system_prompt``, generation prompt
    added) when ``cfg.chat_template``; without it, the raw text (after ``system_prompt + "\\n\\n"`` if one is set).

    Errors: ``ValueError`` when ``cfg.chat_template`` is set and the tokenizer has none;
    :class:`~rlvr.config.RecipeError` for a ``cfg.chat_template_path`` that names no template.
    """
    user = cfg.prompt_template.replace("{question}", question)
    if not cfg.chat_template:
        return f"{cfg.system_prompt}\n\n{user}" if cfg.system_prompt else user
    if not getattr(with_chat_template(tokenizer, cfg), "chat_template", None):
        raise ValueError(
            f"the tokenizer ({getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)}) has no chat template; "
            "set data.chat_template=false to use the raw prompt text, give one (data.chat_template_path: a Jinja "
            "file or chatml), or use an instruct model"
        )
    return tokenizer.apply_chat_template(opening_messages(question, cfg), tokenize=False, add_generation_prompt=True)


def opening_messages(question: str, cfg: DataConfig) -> list[dict[str, str]]:
    """The chat messages a question opens with: the system prompt (if ``cfg.system_prompt``), then the user's
    message, ``cfg.prompt_template`` with ``{question}`` replaced (what :func:`render_prompt` renders, and where a
    multi-turn trajectory starts: :mod:`rlvr.envs`)."""
    messages = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    messages.append({"role": "user", "content": cfg.prompt_template.replace("{question}", question)})
    return messages


def build_prompts(rows: list[dict[str, Any]], tokenizer: Any, cfg: DataConfig,
                  context: tuple | None = None, tools: Any = None) -> tuple[list[Prompt], int]:
    """Template and tokenize ``rows`` (from :func:`load_rows`); drop prompts over ``cfg.max_prompt_tokens``.
    A row with its own ``messages`` (:func:`row_messages`) is rendered from them as is (the chat template with the
    generation prompt; no ``system_prompt`` or ``prompt_template`` added); its question is its last user message.

    Returns (prompts, dropped): each kept :class:`~rlvr.types.Prompt` has ``prompt_ids`` [L], L <=
    ``max_prompt_tokens``, and ``index`` = the row's position in ``rows``; ``dropped`` counts the rows with
    L > ``max_prompt_tokens`` (also logged). With a chat template the text is tokenized with
    ``add_special_tokens=False``, since the template already holds BOS (no doubled BOS); raw text gets the
    tokenizer's special tokens (its BOS) added. ``context``: (the model's context, the tokens after a prompt[,
    their recipe key]) when known, so that the advice for prompts that are all too long stays within what the context holds.
    With ``cfg.chat_template``, ``cfg.chat_template_path``'s template (if set) is set on ``tokenizer`` first
    (:func:`with_chat_template`).
    ``tools``: the recipe's tools listing (:class:`rlvr.tools.formats.ToolListing`), or None: with it each chat
    prompt is rendered as a trajectory's first prompt carries it (the template's ``tools=`` rendering, or the
    listing's system message: :meth:`rlvr.tools.runner.ToolRunner.reset`), so ``max_prompt_tokens`` counts the
    tool schemas too.

    Errors: ``ValueError`` when no rows are given, the tokenizer lacks a needed chat template, or every
    prompt is too long (the message gives the shortest length to set, or, where the context cannot hold it beside
    the response, what to shorten).
    """
    if not rows:
        raise ValueError("no rows to build prompts from; check data.source and data.limit")
    if cfg.chat_template:  # the run's template: the tokenizer's, or data.chat_template_path's
        with_chat_template(tokenizer, cfg)
    if tools is not None and cfg.chat_template:  # the opening as the tool environment renders it
        texts = [tokenizer.apply_chat_template(tools.opening(row_messages(r["row"]) or opening_messages(r["question"],
                                                                                                     cfg)),
                                               tokenize=False, add_generation_prompt=True, **tools.template_kwargs())
                 for r in rows]  # fmt: skip
    else:
        shown = sum(any(m["role"] == "tool" for m in row_messages(r["row"]) or []) for r in rows)
        if shown:  # worked tool calls in the openings, and no tool to answer the model's own
            log.warning("%d of %d rows open with tool messages (worked tool calls) but no tools are given (recipe "
                        "tools:, rlvr eval --tools): the model's calls will go unanswered and its reply be scored "
                        "as it stands", shown, len(rows))
        texts = [render_prompt(r["question"], tokenizer, cfg) if row_messages(r["row"]) is None
                 else tokenizer.apply_chat_template(row_messages(r["row"]), tokenize=False, add_generation_prompt=True)
                 for r in rows]  # a row's own messages are its opening, used as is (no system prompt or template added)
    ids = tokenizer(texts, add_special_tokens=not cfg.chat_template)["input_ids"]
    prompts = [
        Prompt(index=i, text=text, prompt_ids=list(pid), gold=r["gold"], row=r["row"], question=r["question"])
        for i, (r, text, pid) in enumerate(zip(rows, texts, ids))
        if len(pid) <= cfg.max_prompt_tokens
    ]
    dropped = len(rows) - len(prompts)
    if dropped:
        log.warning(
            "dropped %d of %d prompts longer than data.max_prompt_tokens=%d (longest: %d tokens)",
            dropped, len(rows), cfg.max_prompt_tokens, max(len(p) for p in ids),
        )
    if not prompts:
        shortest = min(len(p) for p in ids)
        head = f"all {len(rows)} prompts are longer than data.max_prompt_tokens={cfg.max_prompt_tokens}; "
        raise ValueError(head + _too_long_fix(shortest, context, tools is not None))
    return prompts, dropped


def _too_long_fix(shortest: int, context: tuple | None, tools: bool = False) -> str:
    """The fix for prompts that are all too long: raise ``data.max_prompt_tokens`` to the shortest prompt where
    the model's context holds it beside the response; else lower what follows the prompt or shorten prompts
    (``tools``: the prompts carry the tools listing, named among what to shorten). ``context``: (the model's
    context, the tokens after a prompt[, their recipe key: ``rollout.max_new_tokens`` when not given])."""
    if context is None:
        return f"set data.max_prompt_tokens >= {shortest}"
    ctx, new, *rest = context
    key = rest[0] if rest else "rollout.max_new_tokens"
    room = ctx - new
    listing = ", the tools listing (fewer tools in tools.names, shorter docstrings)" if tools else ""
    shorten = f"shorten the prompts (data.prompt_template, data.system_prompt, the questions{listing})"
    if shortest <= room:
        return (f"set data.max_prompt_tokens >= {shortest} (at most {room}: the model's {ctx}-token context less "
                f"{key}={new})")
    if shortest < ctx:
        return (f"the shortest ({shortest} tokens) fits the model's {ctx}-token context beside at most "
                f"{ctx - shortest} new tokens, not {key}={new}: lower {key} to "
                f"{ctx - shortest} or less and set data.max_prompt_tokens >= {shortest}, or {shorten}")
    return (f"the shortest ({shortest} tokens) leaves no room for a response in the model's {ctx}-token context: "
            f"{shorten}, or use a model with a longer context")
