"""The package's shape (issue 11): no import circle (imports inside functions count; only ``if TYPE_CHECKING:``
imports are skipped), ``rlvr/config.py`` a leaf (it imports neither torch nor the algorithms), and loading any
shipped recipe imports no torch (the registries resolve settings without it)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "rlvr"


def _module_name(f: Path) -> str:
    parts = f.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(f: Path) -> set[str]:
    """Every module ``f`` imports (``from a import b`` gives a and a.b), outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(f.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
            for n in ast.walk(node)}  # fmt: skip
    out: set[str] = set()
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            out |= {n.module} | {f"{n.module}.{a.name}" for a in n.names}
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module_name(f): f for f in PKG.rglob("*.py")}
    graph = {m: {d for d in _imports(f) if d in files and d != m} for m, f in files.items()}
    # a package's __init__ importing its own children (and a child its package) is not a circle of interest
    return {m: {d for d in ds if not (d.startswith(m + ".") or m.startswith(d + "."))} for m, ds in graph.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_config_is_a_leaf():
    imported = _imports(PKG / "config.py") | _imports(PKG / "config_sections.py")
    assert not {m for m in imported if m == "torch" or m.startswith(("torch.", "rlvr.algos", "rlvr.recipe"))}
    assert {m for m in imported if m.startswith("rlvr") and not m.startswith("rlvr.config_sections")} <= {
        "rlvr.hardware", "rlvr.hardware.fast_dtype"}
    assert not {m for m in _imports(PKG / "config_sections.py") if m.startswith("rlvr")}


def test_loading_every_shipped_recipe_imports_no_torch():
    code = (
        "import sys, glob\n"
        "from rlvr.recipe import load_recipe\n"
        "paths = sorted(glob.glob('recipes/*.yaml') + glob.glob('recipes/methods/*.yaml'))\n"
        "for p in paths: load_recipe(p)\n"
        "print(len(paths), sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    n, loaded = out.split(" ", 1)
    assert int(n) >= 15 and loaded.strip() == "[]"


def test_the_low_floors_import_nothing_of_rlvr():
    """Issue 39: the worker pool (rlvr.workers), the loader of user files (rlvr.userfiles) and the hardware facts
    (rlvr.hardware: set_threads among them) stand on no other rlvr module, and torch only inside functions."""
    for name in ("workers", "userfiles", "hardware"):
        tree = ast.parse((PKG / f"{name}.py").read_text())
        top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        top |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in _imports(PKG / f"{name}.py") if m.startswith("rlvr")}, name
        assert "torch" not in top, name


def test_rewards_environments_and_tools_do_not_reach_up_into_the_runtime():
    """The verifier, environment and tool layers stand on the low floors, never on rlvr.runtime (its worker pool
    lived there once: rlvr.runtime.sandbox)."""
    up = {(_module_name(f), m) for d in ("reward", "envs", "tools") for f in (PKG / d).rglob("*.py")
          for m in _imports(f) if m.startswith("rlvr.runtime")}  # fmt: skip
    assert up == set()


ABOVE_THE_RUNTIME = {"rlvr", "rlvr.cli", "rlvr.eval_run", "rlvr.evaluate", "rlvr.serve.server", "rlvr.serve.models"}
"""The entry points that sit over rlvr.runtime and import it: ``rlvr.train`` (rlvr/__init__.py), ``rlvr train``
(rlvr/cli.py), ``rlvr eval`` (rlvr/evaluate.py: the pass@k of validation; rlvr/eval_run.py: a run folder's policy),
``rlvr serve`` (rlvr/serve/server.py and models.py: each training model's roles).
rlvr/eval_cli.py and rlvr/verify_cli.py sit up there too but need nothing of the runtime."""


def _runtime(m: str) -> bool:
    return m == "rlvr.runtime" or m.startswith("rlvr.runtime.")


def _up_going(files: dict[str, Path]) -> set[tuple[str, str]]:
    """(module, the rlvr.runtime module it imports) for every module outside rlvr.runtime and the entry points."""
    return {(m, d) for m, f in files.items() if not _runtime(m) and m not in ABOVE_THE_RUNTIME
            for d in _imports(f) if _runtime(d)}  # fmt: skip


def test_no_lower_floor_imports_the_runtime():
    """Issue 39 (the house): rlvr.runtime (the controller, roles, executors, checkpoints) is the top floor; no module
    below it imports it, not even inside a function (the process environment lives in rlvr.environ, the rendezvous
    address in rlvr.hardware, the RNG states in rlvr.seeding, a recipe's GPU processes in rlvr.config). The entry
    points above it stay above: no runtime module reaches them."""
    assert _up_going({_module_name(f): f for f in PKG.rglob("*.py")}) == set()
    graph, reached = _graph(), set()
    todo = [m for m in graph if _runtime(m)]
    while todo:
        for d in graph[todo.pop()] - reached:
            reached.add(d)
            todo.append(d)
    assert reached & ABOVE_THE_RUNTIME == set()


def test_the_up_going_check_sees_an_import_inside_a_function(tmp_path):
    f = tmp_path / "low.py"
    f.write_text("def f():\n    from rlvr.runtime.executors import free_port\n")
    assert _up_going({"rlvr.low": f, "rlvr.cli": f}) == {("rlvr.low", "rlvr.runtime.executors"),
                                                         ("rlvr.low", "rlvr.runtime.executors.free_port")}
