"""scripts/setup.sh checks the free disk before a fresh install, by the extra it installs (issue 27): about 7 GB for
the CPU stack, 16 GB for the CUDA one (the figures and their sources are in the script). Run on a copy of the
script with ``df`` faked, so nothing is installed: the check either stops the script with its message, or lets it
go on to ``$PYTHON -m venv``, here ``false``, which stops it without that message."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _setup(tmp_path: Path, free_gb: float, *args: str) -> subprocess.CompletedProcess:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    df = bin_dir / "df"
    df.write_text("#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
                  f"echo '/dev/fake 999999999 0 {int(free_gb * 1024 * 1024)} 0% /fake'\n")
    df.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHON="false", TMPDIR=str(tmp_path))
    return subprocess.run(["bash", str(repo / "scripts" / "setup.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.mark.parametrize("args, free_gb, refused", [
    ((), 6.5, True), ((), 7.5, False),  # CPU: 7 GB
    (("--gpu",), 15.5, True), (("--gpu",), 16.5, False),  # GPU: 16 GB
])  # fmt: skip
def test_the_disk_needed_depends_on_the_extra(tmp_path, args, free_gb, refused):
    out = _setup(tmp_path, free_gb, *args)
    assert out.returncode != 0  # refused, or stopped at `false -m venv`
    extra, gb = ("GPU", 16) if args else ("CPU", 7)
    message = (f"setup.sh: only {int(free_gb * 1024)} MB free on /fake (for .); installing rlvr's {extra} stack "
               f"(.[{extra.lower()}]) needs about {gb} GB. Free some space (old run folders, /tmp, ~/.cache) and run "
               "it again.")
    assert (message in out.stderr) == refused, out.stderr
