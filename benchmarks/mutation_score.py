"""Mutation score of the math modules against their unit tests (issue 23): killed/total per module.

What it does. For each module below it makes every one-token mutant of its function bodies (docstrings, raise
messages, f-strings and log calls excluded), operators in the style of mutmut: ``+ -`` and ``* /`` swapped,
``//``/``%``/``**`` weakened, each comparison moved to its neighbour (``<`` <-> ``<=``, ``==`` <-> ``!=``,
``is``/``in`` negated), ``and`` <-> ``or``, ``not x`` -> ``x``, ``-x`` -> ``+x``, an int or float constant
plus 1, ``True`` <-> ``False``, a string ``s`` -> ``"XXsXX"``, ``min``/``max``-like names swapped
(``amin``/``amax``, ``minimum``/``maximum``, ``any``/``all``), ``break`` <-> ``continue``. Each mutant is run
in a forked child of one process that imported torch, numpy, sympy and math-verify once: the child serves the
mutated function's code to the live function object (``__code__``, as mutmut's trampolines do: registries and
``from ... import`` copies run the mutant too; nothing on disk changes) and runs, with pytest, only the unit
tests of the module's pool that called the mutated function in an unmutated baseline run (the
"covering" tests; a mutant no test reaches survives as "not covered"). A mutant is killed when a test fails,
errors or the run exceeds its time limit (3 x the covering tests' baseline time + 10 s).

How to read it. One line per module: ``killed/total``, then the survivors split into ``equivalent`` (listed
with the reason, one line each, in docs/mutation.md: the key is
``file::function::source line :: original -> mutated``) and
``UNEXPLAINED``, which the script prints in full. The goal is no unexplained survivor; a new one is either a
missing test (write it) or an equivalent mutant (add it to docs/mutation.md with its reason). The
``score`` is killed / (total - equivalent). Exit status 1 when any module has an unexplained survivor.

How long. About 1,000 mutants over the seven modules (``--list`` prints them). On this 2-core machine, shared
with 3-4 other sessions, the whole run took about 45 minutes at a load of 10-20, and about 7 minutes (exact
2 min, the other six 5 min, as two processes) at a load near 2: ~0.4 s per mutant, most dying on their first
covering test. ``--module kl`` runs one
module (repeatable); ``--list`` prints the mutants' keys without running them; ``--json PATH`` writes the counts.
``MUTATION_DEBUG=1`` prints each mutant's time and exit code.

    .venv/bin/python benchmarks/mutation_score.py [--module NAME ...]

Outside CI (its time); needs only the dev install. In a git worktree without its own install, put the worktree
and a folder holding a link ``rlvr_verifiers -> ../verifiers`` (``.wtpath``) on ``PYTHONPATH``:
``rlvr_verifiers`` must resolve to this checkout's ``verifiers/``, or the script refuses to measure.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EQUIVALENTS_DOC = REPO / "docs" / "mutation.md"

U = "tests/unit/"
MODULES: dict[str, tuple[str, str, list[str]]] = {
    # short name: (import name, file, the unit tests that exercise it: the pool the covering tests come from)
    "advantages": ("rlvr.algos.advantages", "rlvr/algos/advantages.py",
                   [U + f for f in ("test_advantages.py", "test_passk_advantages.py", "test_entry_settings.py",
                                    "test_registry_flags.py", "test_advantage_stage.py", "test_mutation_algos.py",
                                    "test_infra_failures.py")]),
    "losses": ("rlvr.algos.losses", "rlvr/algos/losses.py",
               [U + f for f in ("test_losses.py", "test_objective.py", "test_entry_settings.py", "test_dapo.py",
                                "test_mutation_algos.py")]),
    "kl": ("rlvr.algos.kl", "rlvr/algos/kl.py",
           [U + f for f in ("test_kl.py", "test_objective.py", "test_advantage_stage.py", "test_mutation_algos.py")]),
    "passk": ("rlvr.metrics.passk", "rlvr/metrics/passk.py",
              [U + f for f in ("test_passk.py", "test_eval_metrics.py", "test_mutation_metrics.py")]),
    "intervals": ("rlvr.metrics.intervals", "rlvr/metrics/intervals.py",
                  [U + f for f in ("test_eval_metrics.py", "test_mutation_metrics.py")]),
    "exact": ("rlvr_verifiers._exact", "verifiers/_exact.py",
              [U + f for f in ("test_exact_answers.py", "test_mutation_exact.py")]),
    "advantage_stage": ("rlvr.runtime.advantage_stage", "rlvr/runtime/advantage_stage.py",
                        [U + f for f in ("test_advantage_stage.py", "test_mutation_stage.py",
                                         "test_infra_failures.py")]),
    "reasoning_gym": ("rlvr_verifiers.reasoning_gym", "verifiers/reasoning_gym.py", [U + "test_reasoning_gym.py"]),
    "textarena": ("rlvr.envs.textarena", "rlvr/envs/textarena.py", [U + "test_textarena.py"]),
    "verifiers_env": ("rlvr.envs.verifiers_env", "rlvr/envs/verifiers_env.py", [U + "test_verifiers_env.py"]),
    "environment_verifier": ("rlvr_verifiers.environment", "verifiers/environment.py", [U + "test_env_rows.py"]),
    "restarts": ("rlvr.runtime.restarts", "rlvr/runtime/restarts.py", [U + "test_restarts.py"]),
    "ckpt_write": ("rlvr.train.ckpt_write", "rlvr/train/ckpt_write.py",
                   [U + f for f in ("test_ckpt_write.py", "test_lora.py", "test_chat_templates.py")]),
    "turns": ("rlvr.envs.turns", "rlvr/envs/turns.py",
              [U + f for f in ("test_env_turns.py", "test_turn_limits.py", "test_stateful_tools.py")]),
    "tokens": ("rlvr.envs.tokens", "rlvr/envs/tokens.py",
               [U + f for f in ("test_env_tokens.py", "test_env_turns.py", "test_turn_limits.py",
                                "test_chat_templates.py", "test_formats_mutants.py")]),
    "formats": ("rlvr.tools.formats", "rlvr/tools/formats.py",
                [U + f for f in ("test_tools.py", "test_chat_templates.py", "test_stateful_tools.py",
                                 "test_formats_mutants.py")]),
    "inflight": ("rlvr.rollout.inflight", "rlvr/rollout/inflight.py", [U + "test_inflight_loop.py"]),
    "packing": ("rlvr.train.packing", "rlvr/train/packing.py", [U + "test_packing.py", U + "test_token_budget.py"]),
    "tinker_losses": ("rlvr.algos.tinker_losses", "rlvr/algos/tinker_losses.py", [U + "test_tinker_losses.py"]),
}

_BINOPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
           ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
           ast.BitXor: ast.BitAnd, ast.LShift: ast.RShift, ast.RShift: ast.LShift}
_CMPOPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
           ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_NAMES = {"min": "max", "max": "min", "amin": "amax", "amax": "amin", "minimum": "maximum", "maximum": "minimum",
          "any": "all", "all": "any", "floor": "ceil", "ceil": "floor"}
_LOG_CALLS = {"log", "logger", "logging", "warnings"}


@dataclass
class Mutant:
    key: str  # file::function::source line :: original -> mutated (#n when the same text occurs twice)
    func: str  # top-level function or method qualname (the unit of coverage)
    line: int
    source: str  # the whole mutated module


def _top(qualname: str) -> str:
    return qualname.split(".<locals>")[0]


def _skip_zones(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: docstrings, raise statements, f-strings, log calls, annotations."""
    skip: set[int] = set()

    def mark(n: ast.AST) -> None:
        skip.update(id(x) for x in ast.walk(n))

    for n in ast.walk(tree):
        body = getattr(n, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            mark(body[0])
        if isinstance(n, (ast.Raise, ast.JoinedStr)):
            mark(n)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) \
                and n.func.value.id in _LOG_CALLS:
            mark(n)
        if isinstance(n, ast.AnnAssign):
            mark(n.annotation)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in n.decorator_list:
                mark(d)
            mark(n.args)
            if n.returns is not None:
                mark(n.returns)
    return skip


def _variants(n: ast.AST) -> list[tuple[ast.AST, bool]]:
    """(replacement node, is_statement) for each mutation of ``n``."""
    out: list[tuple[ast.AST, bool]] = []
    if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
        out.append((ast.BinOp(n.left, _BINOPS[type(n.op)](), n.right), False))
    elif isinstance(n, ast.AugAssign) and type(n.op) in _BINOPS:
        out.append((ast.AugAssign(n.target, _BINOPS[type(n.op)](), n.value), True))
    elif isinstance(n, ast.Compare):
        for i, op in enumerate(n.ops):
            if type(op) in _CMPOPS:
                ops = list(n.ops)
                ops[i] = _CMPOPS[type(op)]()
                out.append((ast.Compare(n.left, ops, n.comparators), False))
    elif isinstance(n, ast.BoolOp):
        out.append((ast.BoolOp(ast.Or() if isinstance(n.op, ast.And) else ast.And(), n.values), False))
    elif isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
        out.append((n.operand, False))
    elif isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
        out.append((ast.UnaryOp(ast.UAdd(), n.operand), False))
    elif isinstance(n, ast.Constant):
        v = n.value
        if isinstance(v, bool):
            out.append((ast.Constant(not v), False))
        elif isinstance(v, (int, float)) and not isinstance(v, complex):
            out.append((ast.Constant(v + 1), False))
        elif isinstance(v, str):
            out.append((ast.Constant("XX" + v + "XX"), False))
    elif isinstance(n, ast.Name) and n.id in _NAMES:
        out.append((ast.Name(_NAMES[n.id], n.ctx), False))
    elif isinstance(n, ast.Attribute) and n.attr in _NAMES:
        out.append((ast.Attribute(n.value, _NAMES[n.attr], n.ctx), False))
    elif isinstance(n, ast.Break):
        out.append((ast.Continue(), True))
    elif isinstance(n, ast.Continue):
        out.append((ast.Break(), True))
    return out


def mutants(path: Path) -> list[Mutant]:
    """Every mutant of the function bodies of the file at ``path`` (see the module docstring)."""
    text = path.read_text()
    data = text.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    tree = ast.parse(text)
    lines = text.splitlines()
    skip = _skip_zones(tree)
    rel = path.relative_to(REPO).as_posix()
    out: list[Mutant] = []
    seen: dict[str, int] = {}
    tops: dict[str, str] = {}

    def name_tops(node: ast.AST, qual: str, top: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                sub = child.name if not qual else f"{qual}.{child.name}"
                t = top if top is not None else (sub if not isinstance(child, ast.ClassDef) else None)
                tops[sub] = t or sub
                name_tops(child, sub, t)
            else:
                name_tops(child, qual, top)

    name_tops(tree, "", None)

    def visit(node: ast.AST, qual: str, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                sub = child.name if not qual else f"{qual}.{child.name}"
                visit(child, sub, in_func or not isinstance(child, ast.ClassDef))
                continue
            if in_func and id(child) not in skip and hasattr(child, "end_col_offset"):
                for new, is_stmt in _variants(child):
                    a = starts[child.lineno - 1] + child.col_offset
                    b = starts[child.end_lineno - 1] + child.end_col_offset
                    new_text = ast.unparse(ast.fix_missing_locations(new))
                    bare = is_stmt or (isinstance(child, (ast.Name, ast.Constant)) and not isinstance(new, ast.UnaryOp))
                    repl = new_text if bare else f"({new_text})"
                    src = (data[:a] + repl.encode() + data[b:]).decode()
                    line = lines[child.lineno - 1].strip()
                    line = line if len(line) <= 90 else line[:87] + "..."
                    base = f"{rel}::{qual}::{line} :: {ast.unparse(child)} -> {new_text}"
                    seen[base] = seen.get(base, 0) + 1
                    key = base if seen[base] == 1 else f"{base} #{seen[base]}"
                    out.append(Mutant(key, tops[qual], child.lineno, src))
            visit(child, qual, in_func)

    visit(tree, "", False)
    return out


def _find_code(code, qual: str):
    """The code object named ``qual`` (a top-level function or method) inside a compiled module."""
    for c in code.co_consts:
        if hasattr(c, "co_qualname"):
            if c.co_qualname == qual:
                return c
            found = _find_code(c, qual)
            if found is not None:
                return found
    return None


def _patch(module, m: Mutant) -> None:
    """Give the live function ``m.func`` of ``module`` the mutant's code (every reference to it, registries and
    ``from ... import`` copies included, then runs the mutant; the way mutmut's trampolines work)."""
    import inspect

    obj = module
    for part in m.func.split("."):
        obj = inspect.getattr_static(obj, part)
    obj = inspect.unwrap(getattr(obj, "__func__", obj))
    new = _find_code(compile(m.source, module.__file__, "exec"), m.func)
    if new is None or new.co_freevars != obj.__code__.co_freevars:
        raise RuntimeError(f"cannot patch {m.func}")
    obj.__code__ = new


def _preload(pool: list[str]) -> None:
    """Import the pool's test files (by basename, as pytest's default import mode does for a folder without
    ``__init__.py``) and what they import, so every forked child has them already."""
    import importlib

    for p in pool:
        folder = str((REPO / p).parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        for n in ast.walk(ast.parse((REPO / p).read_text())):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else \
                [n.module] if isinstance(n, ast.ImportFrom) and n.module and not n.level else []
            for name in names:
                try:
                    importlib.import_module(name)
                except Exception:  # noqa: BLE001 - whatever fails here fails in the child's pytest run
                    pass
        importlib.import_module(Path(p).stem)


class _Coverage:
    """pytest plugin: which top-level functions of one file each test calls (setup, call and teardown)."""

    def __init__(self, filename: str) -> None:
        self.filename, self.calls, self.times = os.path.realpath(filename), {}, {}
        self.real: dict[str, bool] = {}

    def pytest_runtest_protocol(self, item, nextitem):
        seen: set[str] = set()

        real = self.real

        def prof(frame, event, arg):
            if event == "call":
                fn = frame.f_code.co_filename
                r = real.get(fn)
                if r is None:
                    r = real[fn] = os.path.realpath(fn) == self.filename
                if r:
                    seen.add(_top(frame.f_code.co_qualname))

        t0 = time.perf_counter()
        sys.setprofile(prof)
        import threading

        threading.setprofile(prof)
        try:
            yield
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
            self.calls[item.nodeid] = sorted(seen)
            self.times[item.nodeid] = time.perf_counter() - t0

    pytest_runtest_protocol.hookwrapper = True  # type: ignore[attr-defined]


def _in_child(fn, timeout: float) -> int:
    """Run ``fn()`` (returns an exit code) in a forked child with stdout/stderr silenced; -9 on timeout."""
    pid = os.fork()
    if pid == 0:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            code = int(fn())
        except BaseException:  # noqa: BLE001 - any failure to run counts as a failing run
            code = 3
        os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.01)


def _pytest_args(nodeids: list[str]) -> list[str]:
    # plain asserts and no plugin autoload (PYTEST_DISABLE_PLUGIN_AUTOLOAD, set in main): 0.3 s of CPU per run
    # instead of 2 s of re-compiling rewritten modules; the time limit is _in_child's
    return ["-x", "-q", "-p", "no:cacheprovider", "--assert=plain", "-o", "addopts=", *nodeids]


def equivalents() -> dict[str, str]:
    """key -> reason, from the table rows ``| `key` | reason |`` of docs/mutation.md."""
    if not EQUIVALENTS_DOC.exists():
        return {}
    out = {}
    for line in EQUIVALENTS_DOC.read_text().splitlines():
        m = re.match(r"^\|\s*`(.+?)`\s*\|\s*(.+?)\s*\|\s*$", line)
        if m:
            out[m.group(1).replace("\\|", "|")] = m.group(2)
    return out


def run_module(short: str, eq: dict[str, str], verbose: bool) -> tuple[int, int, list[Mutant], list[Mutant]]:
    """(killed, total, equivalent survivors, unexplained survivors) for one module."""
    import pytest

    name, rel, pool = MODULES[short]
    path = REPO / rel
    pool = [p for p in pool if (REPO / p).exists()]
    cov = _Coverage(str(path))
    fd, out_json = tempfile.mkstemp(suffix=".json")
    os.close(fd)

    def baseline() -> int:
        code = pytest.main(_pytest_args([str(REPO / p) for p in pool])[1:], plugins=[cov])
        Path(out_json).write_text(json.dumps({"calls": cov.calls, "times": cov.times}))
        return int(code)

    t0 = time.perf_counter()
    import importlib

    module = importlib.import_module(name)
    _preload(pool)
    code = _in_child(baseline, 1800)
    base = json.loads(Path(out_json).read_text() or "{}")
    os.unlink(out_json)
    if code != 0:
        sys.exit(f"{short}: the unmutated unit tests fail (pytest exit {code}); fix them before measuring")
    calls: dict[str, list[str]] = base["calls"]
    times: dict[str, float] = base["times"]
    by_func: dict[str, list[str]] = {}
    for nodeid, funcs in calls.items():
        for f in funcs:
            by_func.setdefault(f, []).append(nodeid)
    ms = mutants(path)
    killed, equiv, unexplained = 0, [], []
    for i, m in enumerate(ms):
        tests = sorted(by_func.get(m.func, []), key=times.__getitem__)  # fastest first: -x stops at a failure
        if tests:
            limit = 3 * sum(times[t] for t in tests) + 10

            def run(m=m, tests=tests) -> int:
                _patch(module, m)
                return int(pytest.main(_pytest_args([str(REPO / t) for t in tests])))

            t1 = time.perf_counter()
            rc = _in_child(run, limit)
            if os.environ.get("MUTATION_DEBUG"):
                print(f"  {time.perf_counter() - t1:5.1f} s rc {rc} tests {len(tests)} {m.key}", flush=True)
        else:
            rc = 0  # not covered by any test: survives
        if rc != 0:
            killed += 1
        elif m.key in eq:
            equiv.append(m)
        else:
            unexplained.append(m)
            if verbose:
                print(f"  UNEXPLAINED survivor: {m.key}  (line {m.line}{'' if tests else ', not covered'})", flush=True)
    dt = time.perf_counter() - t0
    print(f"{short:16s} killed {killed:4d}/{len(ms):4d}   equivalent {len(equiv):3d}   unexplained "
          f"{len(unexplained):3d}   score {killed / max(len(ms) - len(equiv), 1):6.1%}   ({dt:.0f} s)", flush=True)
    return killed, len(ms), equiv, unexplained


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", action="append", choices=sorted(MODULES), help="one module (repeatable); default all")
    ap.add_argument("--list", action="store_true", help="print the mutants' keys and exit")
    ap.add_argument("--quiet", action="store_true", help="do not print each unexplained survivor as it is found")
    ap.add_argument("--json", type=Path, help="write the per-module results here")
    args = ap.parse_args()
    sys.path[:0] = [str(REPO), str(REPO / ".wtpath")]
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / ".wtpath"), os.environ.get("PYTHONPATH", "")])
    names = args.module or list(MODULES)
    if args.list:
        for short in names:
            for m in mutants(REPO / MODULES[short][1]):
                print(f"{m.line:4d} {m.key}")
        return 0
    spec = importlib.util.find_spec("rlvr_verifiers")  # the package's location, without importing it
    here = Path(spec.origin).resolve().parent if spec and spec.origin else None
    if here != (REPO / "verifiers").resolve():
        sys.exit(f"rlvr_verifiers resolves to {here}, not this checkout's verifiers/: put {REPO}/.wtpath "
                 "(a link rlvr_verifiers -> ../verifiers) on PYTHONPATH")
    for heavy in ("torch", "numpy", "sympy", "math_verify", "yaml", "pytest"):  # imported once, shared by every fork
        __import__(heavy)
    try:  # property tests draw the same examples in every run: a mutant is killed or not, never by chance
        from hypothesis import settings

        settings.register_profile("mutation", derandomize=True, database=None, deadline=None)
        settings.load_profile("mutation")
    except ImportError:
        pass
    eq = equivalents()
    results, bad = {}, 0
    for short in names:
        k, n, e, u = run_module(short, eq, not args.quiet)
        results[short] = {"killed": k, "total": n, "equivalent": len(e), "unexplained": [m.key for m in u]}
        bad += len(u)
    print(f"equivalent survivors and their reasons: {EQUIVALENTS_DOC.relative_to(REPO)}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
