"""The seeds rlvr derives (rlvr/seeding.py): values worked out by hand, streams that stay apart, and no seed
arithmetic anywhere else in the package (a derived seed must have one home, or two places drift apart)."""

from __future__ import annotations

import ast
from pathlib import Path

from rlvr import seeding as sd

PKG = Path(__file__).resolve().parents[2] / "rlvr"


def test_values_by_hand():
    assert sd.rollout_seed(1, 2) == 1_000_003 + 2 * 101  # 1_000_205
    # 3000 * 1_000_003 + 5 * 101 + 1 = 3_000_009_506 > 2**31 - 1 = 2_147_483_647: folded once
    assert sd.rollout_seed(3000, 5, 1) == 3_000_009_506 - 2_147_483_647 == 852_525_859
    assert sd.dph_batch_seed(2, 3) == 2_000_009 and sd.dph_prompt_seed(2) == 67
    assert (sd.engine_seed(4, 1), sd.trainer_seed(4, 1), sd.critic_seed(4), sd.epoch_seed(4, 2)) == (5, 5, 11, 6)
    assert (sd.policy_order_seed(2, 3), sd.critic_order_seed(2, 3)) == (15_841, 209_461)
    assert sd.hf_generator_seed(5, 0, 9) == 5_000_015 and sd.hf_generator_seed(None, 2, 3) == 2_000_009
    assert sd.numpy_seed(2**32 + 7) == 7


def test_rollout_streams_of_a_run_never_repeat():
    """Run seeds 0-3, steps 1-2000, rounds 0-3 (DAPO refills), and the DPH buffer's round: all distinct."""
    for seed in range(4):
        seen = {sd.rollout_seed(seed, s, r) for s in range(1, 2001) for r in range(4)}
        assert len(seen) == 2000 * 4
        assert sd.rollout_seed(seed, 0, sd.DPH_BUFFER_ROUND) not in seen


def _seed_arithmetic(tree: ast.AST) -> list[int]:
    """Lines with +, -, *, % or // on a name or attribute called ``*seed*``."""
    def seedy(node: ast.AST) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return "seed" in name.lower()

    ops = (ast.Add, ast.Sub, ast.Mult, ast.Mod, ast.FloorDiv)
    return sorted({n.lineno for n in ast.walk(tree)
                   if isinstance(n, ast.BinOp) and isinstance(n.op, ops) and (seedy(n.left) or seedy(n.right))})  # fmt: skip


def test_no_seed_arithmetic_outside_the_seeding_module():
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "seeding.py":
            continue
        lines = _seed_arithmetic(ast.parse(path.read_text()))
        if lines:
            found[str(path.relative_to(PKG))] = lines
    assert not found, f"derive these seeds in rlvr/seeding.py: {found}"


def test_the_check_finds_what_it_looks_for():
    assert _seed_arithmetic(ast.parse("g.manual_seed(r.run.seed * 7919 + v)\nx = seed + 1\ny = base_seed % 7")) == [1, 2, 3]
    assert _seed_arithmetic(ast.parse("g.manual_seed(policy_order_seed(r.run.seed, v))\nx = a + b")) == []
