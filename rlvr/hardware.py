"""What the machine can do fast, read without importing torch (recipe loading stays light), the thread and core
settings of a role's process (:func:`set_threads`, :func:`bind_cpus`), and where this host is reached (:func:`host_ip`,
:func:`free_port`: the rendezvous address of a group whose rank 0 lives here).

``model.dtype: auto`` (the default) resolves through :func:`fast_dtype` when a recipe is loaded.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """True when this x86 CPU has native bf16 matmul instructions (``avx512_bf16`` or ``amx_bf16`` among the
    ``flags`` of /proc/cpuinfo, or of ``cpuinfo`` when given); True where that cannot be read (not Linux x86: no
    claim either way).

    Measured on an AVX2-only AMD EPYC (2 threads, torch 2.13 CPU): a 640x576 @ 576x1536 matmul takes 1.06 s in bf16
    and 0.011 s in fp32 (~100x); on CPUs with AMX the smoke recipe's trainer ran 18.5 s in bf16 and 26 s in fp32.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True
    if "flags" not in cpuinfo:
        return True
    return "avx512_bf16" in cpuinfo or "amx_bf16" in cpuinfo


def fast_dtype(num_gpus: float, cpuinfo: str | None = None) -> str:
    """The faster training/rollout dtype here: ``"bfloat16"`` when the trainer asks for GPUs (``num_gpus > 0``;
    bf16 needs Ampere or newer: on older GPUs set ``model.dtype: float16`` or ``float32``) or the CPU has native
    bf16 (:func:`cpu_has_bf16`), else ``"float32"``. bf16 and fp32 learn alike per step (fp32 master weights,
    issue 10), so this only picks the speed. On a CPU cluster the driver's CPU stands for the workers'.
    """
    return "bfloat16" if num_gpus > 0 or cpu_has_bf16(cpuinfo) else "float32"


def bind_cpus(cpus: "tuple[int, ...] | list[int]") -> None:
    """Bind the calling thread (and the threads it starts later, torch's OpenMP pool among them) to ``cpus``
    (``rollout.cpus`` / ``trainer.cpus``); nothing when empty. Under the Ray executor each role is its own
    process, so this binds the role; under the local executor, only the role's thread.
    Errors: ``ValueError`` naming the cores this machine lacks."""
    if not cpus:
        return
    have = os.sched_getaffinity(0)
    missing = sorted(set(cpus) - have)
    if missing:
        raise ValueError(f"cores {missing} are not available here (allowed: {sorted(have)}): fix rollout.cpus / "
                         "trainer.cpus")
    os.sched_setaffinity(0, set(cpus))


def set_threads(n: int) -> None:
    """Set torch's intra-op threads for this process (``OMP_NUM_THREADS`` too, for what starts later), the
    ``*.threads`` of a role; n <= 0: leave as is. torch is imported here, not at the module's top (recipe loading
    stays light)."""
    if n > 0:
        import torch

        os.environ["OMP_NUM_THREADS"] = str(n)
        torch.set_num_threads(n)


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep what this process frees for its next allocations (``trainer.malloc: keep``): no
    ``mmap`` for large blocks (``M_MMAP_MAX`` 0) and no trimming of the heap (``M_TRIM_THRESHOLD`` -1), as a
    caching allocator does. By default every block over glibc's mmap threshold (at most 32 MiB: the logits, their
    log-softmax and gradients of a micro-batch) is a fresh ``mmap`` whose pages fault in and are zeroed at first
    touch, then unmapped at its free: the smoke recipe's trainer step took ~2 million minor page faults (~8 GB) and
    11% of its CPU time in the kernel; kept, ~0 faults and 1.08-1.15x faster (benchmarks/trainer_spread.py). On a
    VM the cost of those faults depends on the host (pages returned to it are faulted back), so it also varied
    between runs. The process's resident memory stays at its peak. True when applied; False where the C library
    is not glibc (nothing changed)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_MAX, 0) == 1
    return ok and mallopt(M_TRIM_THRESHOLD, -1) == 1  # -1: never trim (mallopt(3))


def free_port() -> int:
    """A TCP port that is free on this host right now."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def host_ip() -> str:
    """This node's IP as the other nodes reach it (127.0.0.1 when it has no other)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:
        pass
    return "127.0.0.1"
