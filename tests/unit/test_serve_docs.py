"""docs/serve.md shows examples/serve_client.py's code (all of it but the module docstring) in its python block and
says it is the same code: editing one side alone fails here."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _doc_block() -> list[str]:
    """The lines of docs/serve.md's one ```python block."""
    lines = (REPO / "docs" / "serve.md").read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "```python"]
    assert len(starts) == 1, f"docs/serve.md has {len(starts)} ```python blocks; this test reads exactly one"
    end = next(i for i in range(starts[0] + 1, len(lines)) if lines[i].strip() == "```")
    return lines[starts[0] + 1 : end]


def _script_body() -> list[str]:
    """examples/serve_client.py after its module docstring and the blank lines that follow it."""
    lines = (REPO / "examples" / "serve_client.py").read_text().splitlines()
    assert lines[0].startswith('"""'), "examples/serve_client.py no longer starts with a docstring"
    i = 0 if lines[0].count('"""') >= 2 else next(k for k in range(1, len(lines)) if '"""' in lines[k])
    i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return lines[i:]


def test_serve_md_client_block_is_examples_serve_client():
    doc, script = _doc_block(), _script_body()
    assert doc, "docs/serve.md's python block is empty"
    diff = next((k for k, (a, b) in enumerate(zip(doc, script)) if a != b), min(len(doc), len(script)))
    assert doc == script, (
        f"docs/serve.md's python block ({len(doc)} lines) differs from examples/serve_client.py after its docstring "
        f"({len(script)} lines) at line {diff + 1} of the block: "
        f"{(doc[diff:diff + 1] or ['<end>'])[0]!r} vs {(script[diff:diff + 1] or ['<end>'])[0]!r}"
    )
