"""Every role imports the driver's rlvr (issue 24, rlvr.runtime.codepath): the setup hook Ray runs in each worker,
pickled by value, pins ``rlvr`` to the driver's folder against a decoy package first on ``sys.path`` (as Ray puts
the driver's working directory there), and moves the driver's root ahead of the decoy for the processes a role
starts. The real Ray path: tests/integration/test_quiet_console.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import rlvr
from rlvr.runtime.codepath import by_value, driver_packages, pin_hook, put_first

RLVR_DIR = str(Path(rlvr.__file__).absolute().parent)
ROOT = str(Path(RLVR_DIR).parent)


def _decoy(tmp_path: Path) -> Path:
    clone = tmp_path / "clone"
    (clone / "rlvr").mkdir(parents=True)
    (clone / "rlvr" / "__init__.py").write_text("raise ImportError('the decoy rlvr was imported')\n")
    return clone


def test_driver_packages_are_the_folders_this_process_imports():
    found = driver_packages()
    assert found["rlvr"] == RLVR_DIR
    import rlvr_verifiers

    assert found["rlvr_verifiers"] == str(Path(rlvr_verifiers.__file__).absolute().parent)


def test_the_drivers_root_goes_ahead_of_a_decoy_only(tmp_path):
    clone = _decoy(tmp_path)
    path = [str(clone), "/elsewhere", ROOT]
    put_first("rlvr", RLVR_DIR, path)
    assert path == [ROOT, str(clone), "/elsewhere", ROOT]
    ahead = [ROOT, str(clone)]
    put_first("rlvr", RLVR_DIR, ahead)  # the driver's comes first already
    assert ahead == [ROOT, str(clone)]
    plain = ["/elsewhere"]
    put_first("rlvr", RLVR_DIR, plain)  # nothing shadows it: the path stays as it is
    assert plain == ["/elsewhere"]
    renamed = [str(clone)]
    put_first("rlvr_verifiers", str(tmp_path / "verifiers"), renamed)  # an editable install's verifiers/ folder
    assert renamed == [str(clone)]


def test_the_hook_runs_without_rlvr_and_pins_the_drivers(tmp_path):
    """A fresh interpreter whose working directory holds a decoy rlvr (first on its sys.path, as ``-c`` puts it):
    unpickling the hook must not import rlvr (it goes by value), and after it ``import rlvr`` is the driver's."""
    import ray.cloudpickle

    clone = _decoy(tmp_path)
    by_value()
    hook = ray.cloudpickle.dumps(pin_hook(driver_packages()))
    child = ("import pickle, sys\nhook = pickle.loads(sys.stdin.buffer.read())\nassert 'rlvr' not in sys.modules\n"
             "hook()\nimport rlvr\nprint(rlvr.__file__)\nprint(sys.path.index(%r) < sys.path.index(''))\n" % ROOT)
    env = {"PATH": "/usr/bin:/bin"}  # no PYTHONPATH: the venv's own packages (ray), the decoy first
    p = subprocess.run([sys.executable, "-c", child], input=hook, cwd=clone, env=env, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert p.stdout.decode().split() == [str(Path(RLVR_DIR) / "__init__.py"), "True"]


def test_the_hook_gives_rlvr_records_a_handler_on_stderr(tmp_path):
    """With a log format, the hook sends rlvr's INFO records (not DEBUG, not other loggers') to stderr in that
    format, once even when run twice, without a copy through the root logger."""
    import ray.cloudpickle

    by_value()
    hook = ray.cloudpickle.dumps(pin_hook(driver_packages(), "rlvr %(levelname)s %(name)s: %(message)s"))
    child = ("import logging, pickle, sys\nlogging.basicConfig(level=logging.DEBUG, format='root: %(message)s')\n"
             "hook = pickle.loads(sys.stdin.buffer.read())\nhook()\nhook()\n"
             "logging.getLogger('rlvr.train.packing').info('packed')\n"
             "logging.getLogger('rlvr.train.packing').debug('detail')\n"
             "logging.getLogger('rlvr.x').warning('careful')\n")
    p = subprocess.run([sys.executable, "-c", child], input=hook, cwd=tmp_path, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert p.stderr.decode().splitlines() == ["rlvr INFO rlvr.train.packing: packed", "rlvr WARNING rlvr.x: careful"]
