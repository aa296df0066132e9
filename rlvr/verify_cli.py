"""``rlvr verify FILE.jsonl --verifier NAME``: score saved completions offline, through the scoring pool.

Each non-blank line of FILE is a JSON object with a response field (``--response-field``, default
``response``) and a gold field (``--gold-field``, default ``gold``); its other fields are passed to the
verifier as the data row (``numbers`` for ``countdown``, ``choices`` for ``choice``). Every row is scored by
:class:`rlvr.reward.pool.ScoringPool` (worker processes, a hard per-row time limit), exactly as in training.

Output: one JSON object per input row, in input order (to ``--output``, else to stdout)::

    {"line": 3, "id": "q17", "score": 1.0, "parsed": "42", "reason": null, "latency_s": 0.0012}

``line`` is the 1-based line number in FILE; ``id`` is copied when the row has one. A line that is not a JSON
object, or lacks a field, gives ``score`` 0 and ``reason`` ``bad_input: <what>`` instead of stopping the run.

Golds are read as ``--answer-format`` says (``raw``: the field as is; ``gsm8k``: the number after the last
``#### ``, as ``data.answer_format`` in a recipe) and checked as training checks them when data loads
(:func:`rlvr.reward.golds.gold_checker`, case V15, issue 9 item 12): a row whose gold the verifier cannot
read as one final answer (a whole worked solution, a number with a label under ``units: refuse``...) is not
scored: ``score`` 0, ``reason`` ``bad_gold: <why and the setting that fixes it>``, and the summary counts them
with up to five examples. ``--bad-gold error`` stops before scoring instead (exit 2).
Then a summary (rows, mean score over all rows, rows per reason, latency p50/p99, bad golds) goes to stdout
when ``--output`` is given, else to stderr (stdout holds the results).

Exit status: 0 when every row was processed (whatever the scores); 2 for a missing or unreadable FILE, a
verifier that does not resolve or build, or bad ``--args``; 2 also with ``--bad-gold error`` when some gold is
unusable (nothing is written then).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
from pathlib import Path
from typing import Any, Iterator, TextIO

CHUNK_ROWS = 512
"""Rows scored per call to the pool (results are written after each chunk)."""


def add_verify_parser(sub: Any) -> None:
    """Register the ``verify`` subcommand on an ``argparse`` subparsers object (see :func:`cmd_verify`)."""
    p = sub.add_parser("verify", help="score a JSONL file of responses with a verifier (no training)")
    p.add_argument("file", help="JSONL file: one object a line with a response and a gold field")
    p.add_argument("--verifier", required=True, help="built-in name (math, numeric, ...), module:attr or file.py:attr")
    p.add_argument("--args", default="{}", help='constructor args of the verifier as JSON, e.g. \'{"think": true}\'')
    p.add_argument("--output", "-o", help="write results here (default: stdout)")
    p.add_argument("--response-field", default="response", help="field holding the response (default: response)")
    p.add_argument("--gold-field", default="gold", help="field holding the gold answer (default: gold)")
    p.add_argument("--workers", type=int, default=2, help="scoring worker processes (default: 2)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per row before it scores 0 'timeout'")
    p.add_argument("--answer-format", choices=("raw", "gsm8k"), default="raw",
                   help="raw: the gold field as is; gsm8k: the number after its last '#### ' (as data.answer_format)")
    p.add_argument("--bad-gold", choices=("score", "error"), default="score",
                   help="rows whose gold the verifier cannot use: score 0 'bad_gold: ...' (default) or stop (exit 2)")
    p.set_defaults(fn=cmd_verify)


def _fail(message: str) -> int:
    print(f"rlvr verify: {message}", file=sys.stderr)
    return 2


def read_rows(
    lines: Iterator[str], response_field: str, gold_field: str
) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """``(line_no, row, problem)`` for each non-blank line: ``row`` a dict with ``response`` and ``gold`` as
    text when usable, else None and ``problem`` = ``bad_input: <what>``."""
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            yield line_no, None, f"bad_input: line {line_no} is not valid JSON ({e.msg})"
            continue
        if not isinstance(row, dict):
            yield line_no, None, f"bad_input: line {line_no} is a JSON {type(row).__name__}, not an object"
            continue
        missing = [f for f in (response_field, gold_field) if row.get(f) is None]
        if missing:
            yield line_no, row, f"bad_input: no field {', '.join(map(repr, missing))} (fields: {', '.join(row)})"
            continue
        if not isinstance(row[response_field], str):
            yield line_no, row, f"bad_input: field {response_field!r} is a {type(row[response_field]).__name__}"
            continue
        yield line_no, row, None


def read_gold(value: Any, answer_format: str) -> tuple[str, str | None]:
    """``(gold, problem)``: the gold text of a row's gold field read as ``answer_format`` (``raw`` or
    ``gsm8k``, as :func:`rlvr.data.datasets.load_rows` reads ``data.answer_format``), and None, or a
    ``bad_gold: ...`` problem (no ``#### `` marker under ``gsm8k``; an empty gold)."""
    from rlvr.data.datasets import format_gold, gsm8k_gold

    if answer_format == "gsm8k":
        gold = gsm8k_gold(str(value))
        if gold is None:
            return str(value), "bad_gold: no '#### ' marker for --answer-format gsm8k (use --answer-format raw)"
    else:
        gold = format_gold(value)
    return gold, (None if gold else "bad_gold: empty gold")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the ``ceil(q/100 * n)``-th smallest of ``n`` values (NaN when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def reason_key(reason: str | None) -> str:
    """A reason's kind for the summary: the text before its first ``:`` (``unknown_number: 7`` ->
    ``unknown_number``); ``correct`` for None (full marks)."""
    return "correct" if reason is None else reason.split(":", 1)[0]


class _Summary:
    def __init__(self) -> None:
        self.rows = 0
        self.score_sum = 0.0
        self.reasons: collections.Counter[str] = collections.Counter()
        self.latencies: list[float] = []
        self.bad_golds: list[tuple[int, str, str]] = []  # (line, gold, reason)

    def add(self, result: dict[str, Any]) -> None:
        self.rows += 1
        self.score_sum += result["score"]
        self.reasons[reason_key(result["reason"])] += 1
        if "latency_s" in result:
            self.latencies.append(result["latency_s"])

    def text(self) -> str:
        mean = self.score_sum / self.rows if self.rows else math.nan
        lines = [f"rows: {self.rows}", f"mean score: {mean:.4f} (over all {self.rows} rows)", "reasons:"]
        lines += [f"  {k}: {n}" for k, n in self.reasons.most_common()]
        p50, p99 = percentile(self.latencies, 50), percentile(self.latencies, 99)
        n = len(self.latencies)
        if n:
            lines.append(f"latency: p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms (over {n} scored rows)")
        else:
            lines.append("latency: n/a (no row was scored)")
        if self.bad_golds:
            lines.append(bad_gold_text(self.bad_golds, self.rows))
        return "\n".join(lines)


def bad_gold_text(bad: list[tuple[int, str, str]], rows: int) -> str:
    """The summary's warning: how many rows have an unusable gold, and the first five (line, gold, reason)."""
    from rlvr.reward.golds import EXAMPLES

    shown = "\n".join(f"  line {n}: {g[:80]!r}: {r}" for n, g, r in bad[:EXAMPLES])
    more = f"\n  and {len(bad) - EXAMPLES} more" if len(bad) > EXAMPLES else ""
    return f"WARNING: {len(bad)} of {rows} rows have a gold the verifier cannot use (not scored):\n{shown}{more}"


class _GoldCheck:
    """Each distinct gold checked once with the verifier's gold parser (None: the verifier has none)."""

    def __init__(self, checker: Any) -> None:
        self.checker = checker
        self.verdicts: dict[str, str | None] = {}

    def problem(self, gold: str) -> str | None:
        if self.checker is None:
            return None
        if gold not in self.verdicts:
            try:
                self.verdicts[gold] = self.checker(gold)
            except Exception as e:  # noqa: BLE001 - a plugin's check that raises names the row
                self.verdicts[gold] = f"error: {type(e).__name__}: {str(e)[:200]}"
        why = self.verdicts[gold]
        return None if why is None else f"bad_gold: {why}"


def _with_golds(chunk: list[tuple[int, dict[str, Any] | None, str | None]], args: argparse.Namespace,
                golds: _GoldCheck, summary: _Summary) -> list[tuple[int, dict[str, Any] | None, str | None, str]]:
    """``(line, row, problem, gold)`` per item: the gold read (``--answer-format``) and checked."""
    out = []
    for line_no, row, problem in chunk:
        gold = ""
        if problem is None and row is not None:
            gold, problem = read_gold(row[args.gold_field], args.answer_format)
            problem = problem or golds.problem(gold)
            if problem is not None:
                summary.bad_golds.append((line_no, gold, problem.removeprefix("bad_gold: ")))
        out.append((line_no, row, problem, gold))
    return out


def _score_chunk(pool: Any, chunk: list[tuple[int, dict[str, Any] | None, str | None, str]],
                 args: argparse.Namespace, out: TextIO, summary: _Summary) -> None:
    usable = [(n, row, gold) for n, row, problem, gold in chunk if problem is None]
    drop = {args.response_field, args.gold_field}
    scored = iter(pool.score(
        [row[args.response_field] for _, row, _ in usable],
        [gold for _, _, gold in usable],
        [{k: v for k, v in row.items() if k not in drop} for _, row, _ in usable],
    ) if usable else [])
    key = pool.keys[0]
    for line_no, row, problem, _ in chunk:
        result: dict[str, Any] = {"line": line_no}
        if row is not None and "id" in row:
            result["id"] = row["id"]
        if problem is not None:
            result.update(score=0.0, parsed=None, reason=problem)
        else:
            s = next(scored)
            r = s.results[key]
            result.update(score=r.score, parsed=r.parsed, reason=r.reason, latency_s=round(s.latency_s, 6))
        out.write(json.dumps(result, ensure_ascii=False) + "\n")
        summary.add(result)


def _first_bad_gold(path: Path, args: argparse.Namespace, golds: _GoldCheck) -> str | None:
    """With ``--bad-gold error``: the message listing every unusable gold of FILE, or None when all are usable."""
    summary = _Summary()
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            items = list(read_rows(f, args.response_field, args.gold_field))
    except OSError as e:
        return f"cannot read '{args.file}': {e.strerror or e}"
    _with_golds(items, args, golds, summary)
    if not summary.bad_golds:
        return None
    return bad_gold_text(summary.bad_golds, len(items)) + "\n--bad-gold error: nothing scored"


def cmd_verify(args: argparse.Namespace) -> int:
    """Run ``rlvr verify`` (module docstring); returns the exit status."""
    from rlvr.config import VerifierSpec
    from rlvr.reward.golds import gold_checker
    from rlvr.reward.pool import ScoringPool

    path = Path(args.file)
    if not path.is_file():
        return _fail(f"input file '{args.file}' not found" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        verifier_args = json.loads(args.args)
        if not isinstance(verifier_args, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        return _fail(f"--args must be a JSON object of constructor args, got {args.args!r} ({e})")
    if args.workers < 1 or not args.timeout > 0:
        return _fail(f"--workers must be >= 1 and --timeout > 0, got {args.workers} and {args.timeout}")
    spec = VerifierSpec(name=args.verifier, args=verifier_args)
    try:
        golds = _GoldCheck(gold_checker(spec))  # builds it here: a bad name or args is one line, not a traceback
    except Exception as e:  # noqa: BLE001 - unknown name, import error, bad args: all reported the same way
        return _fail(f"cannot build verifier {args.verifier!r}: {type(e).__name__}: {e}")
    if args.bad_gold == "error":
        problem = _first_bad_gold(path, args, golds)
        if problem is not None:
            return _fail(problem)
    try:
        pool = ScoringPool([spec], args.workers, args.timeout)
    except Exception as e:  # noqa: BLE001 - unknown name, import error, bad args: all reported the same way
        return _fail(f"cannot build verifier {args.verifier!r}: {type(e).__name__}: {e}")
    summary = _Summary()
    try:
        out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    except OSError as e:
        pool.close()
        return _fail(f"cannot write '{args.output}': {e.strerror or e}")
    try:
        with pool, path.open(encoding="utf-8", errors="replace") as f:
            chunk: list[tuple[int, dict[str, Any] | None, str | None]] = []
            for item in read_rows(f, args.response_field, args.gold_field):
                chunk.append(item)
                if len(chunk) >= CHUNK_ROWS:
                    _score_chunk(pool, _with_golds(chunk, args, golds, summary), args, out, summary)
                    chunk = []
            if chunk:
                _score_chunk(pool, _with_golds(chunk, args, golds, summary), args, out, summary)
    except OSError as e:
        return _fail(f"cannot read '{args.file}': {e.strerror or e}")
    finally:
        if out is not sys.stdout:
            out.close()
        else:
            out.flush()
    print(summary.text(), file=sys.stdout if args.output else sys.stderr)
    if args.output:
        print(f"results: {args.output}")
    return 0
