"""Shared setup for integration tests: caches inside a per-session folder, one torch thread per process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def _integration_env(tmp_path_factory):
    cache = os.environ.get("RLVR_CACHE") or str(Path.home() / ".cache" / "rlvr")
    tmp = tmp_path_factory.mktemp("rlvr_integration")
    env = {
        "RLVR_CACHE": cache,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(tmp / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
        "TORCH_EXTENSIONS_DIR": str(Path(cache) / "torch_extensions"),
        "RAY_AUTH_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v



_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the test process here, with pytest's exit status, once pytest has reported everything: the engines,
    gloo groups and Ray clients the integration tests built in this process leave native threads behind, and the
    interpreter's own shutdown after them crashed once in CI (SIGSEGV after "86 passed": exit 139, no test
    failed). A crash during a test still shows (pytest's faulthandler), and so does one in the processes the tests
    start."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS[-1] if _EXIT_STATUS else 0)
