"""Run a test's body in a fresh Python process: DeepSpeed leaves torch.distributed state behind in the process that
built an engine, so each such case gets a process of its own and hands back a JSON-serialisable result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def call_in_child(module: str, func: str, *args: Any, timeout_s: float, path: tuple[Path, ...] = ()) -> Any:
    """``module.func(*args)`` (a module of this folder or of ``path``; ``args`` as Python literals) in a child
    process; returns its result through JSON. Fails the test with the child's stderr tail when it exits non-zero
    or prints no result; ``subprocess.TimeoutExpired`` after ``timeout_s`` seconds."""
    dirs = [str(HERE), *(str(p) for p in path)]
    code = (f"import sys, json; sys.path[:0] = {dirs!r}; import {module} as m; "
            f"print('RESULT=' + json.dumps(m.{func}(*{args!r})))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT=")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT="))
