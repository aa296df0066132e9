"""rlvr.hardware's process settings: trainer.malloc's keep_freed_memory, checked on the page faults it saves."""

from __future__ import annotations

import subprocess
import sys

_REALLOC = """
import resource, sys, torch
from rlvr.hardware import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
def faults(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
out = []
for _ in range(6):  # 40 MiB, over glibc's largest mmap threshold (32 MiB), allocated, written and freed
    f0 = faults(); x = torch.empty(40 << 18).fill_(1.0); f1 = faults(); del x
    out.append(f1 - f0)
print(applied, *out)
"""


def test_keep_freed_memory_reuses_a_large_block_without_page_faults():
    """A 40 MiB tensor allocated, written and freed six times: glibc's default maps it afresh each time (40 MiB /
    4 KiB = 10,240 page faults as it is written); kept (trainer.malloc: keep), the heap grows once or twice (small
    allocations in between may take a piece of the freed block) and then the block's pages are reused: no fault."""
    out = {}
    for mode in ("keep", "system"):
        p = subprocess.run([sys.executable, "-c", _REALLOC, mode], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        out[mode] = p.stdout.split()
    keep, system = [int(n) for n in out["keep"][1:]], [int(n) for n in out["system"][1:]]
    assert out["keep"][0] == "True" and sum(keep[-3:]) < 100, keep
    assert out["system"][0] == "None" and all(10_240 <= n <= 10_240 + 100 for n in system), system


def test_keep_freed_memory_changes_nothing_without_glibcs_mallopt(monkeypatch):
    """A C library without mallopt (musl's is a stub, macOS has none): False, nothing called."""
    import ctypes

    from rlvr.hardware import keep_freed_memory

    class NoMallopt:
        def __init__(self, name):
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)
    assert keep_freed_memory() is False
