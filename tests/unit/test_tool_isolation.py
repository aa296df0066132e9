"""Typed tools run isolated (rlvr.tools.isolation): a hostile tool (tests/unit/tools_hostile.py) that tries to undo
its mounts, write outside its folder, read a secret from the trainer's environment, list and read the folder its own
file lies in, and fork children that leave its process group, run in each isolation mode this machine gives, as root
and as a non-root user; and the per-tool opt-outs (rlvr.tools.registry.access), the call's own folder, the start-up
log line and its warnings.

Each mode runs in a fresh interpreter whose environment holds the secret from its start (as a trainer's would:
the tool workers and every process they start inherit it unless it is scrubbed). A non-root user: $RLVR_TEST_USER
or ``rlvrtest`` (``useradd -m rlvrtest``); as root the script becomes that user (tools_hostile.become)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from rlvr.tools.execute import ToolPool
from rlvr.tools.isolation import NPROC_BUDGET, Isolation, machine_isolation, nobody, tasks_of
from rlvr.tools.registry import Access, resolve_tools
from tests.unit.tools_hostile import wait_gone

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "unit" / "tools_hostile.py"
SECRET_NAME = "RLVR_TEST_SECRET"
ROOT = os.geteuid() == 0


def _user() -> str | None:
    """The non-root user the user modes run as: ``RLVR_TEST_USER``, else ``rlvrtest``, created here (``useradd -m``)
    when the tests run as root and it does not exist yet, so the README's test command covers the non-root modes
    on a fresh machine; None where there is none and it cannot be made (not root, no useradd)."""
    name = os.environ.get("RLVR_TEST_USER", "rlvrtest")
    try:
        return pwd.getpwnam(name).pw_name
    except KeyError:
        pass
    if ROOT and "RLVR_TEST_USER" not in os.environ and shutil.which("useradd"):
        subprocess.run(["useradd", "-m", name], capture_output=True, check=False)
        try:
            return pwd.getpwnam(name).pw_name
        except KeyError:
            return None
    return None


@pytest.fixture
def open_folder():
    """As root: a folder in /run (which no mode hides) open to everyone, so a write there shows the read-only
    remount (the ns-* modes) or its absence; else None (the harness makes one in the temporary folder)."""
    if not ROOT or not os.path.isdir("/run"):
        yield None
        return
    folder = Path("/run") / f"rlvr-isolation-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    yield str(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _hostile(mode: str, user: str | None, folder: str | None) -> dict:
    """Run the harness in ``mode`` (as ``user`` when given: from root), with a fresh secret in its environment; the
    survivors of its last call (it dies mid-call) counted here, after up to 10 s."""
    secret = uuid.uuid4().hex
    cmd = [sys.executable, str(HARNESS), mode, SECRET_NAME, *([folder] if folder else [])]
    if user is not None:
        cmd = ["unshare", "--mount", sys.executable, str(HARNESS), "--become", user, *cmd[2:]]
    p = subprocess.run(cmd, env={**os.environ, SECRET_NAME: secret}, capture_output=True, text=True, timeout=90,
                       cwd=REPO)  # fmt: skip
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the harness printed nothing (rc {p.returncode}):\n{p.stderr[-3000:]}"
    out = json.loads(lines[-1])
    if "unavailable" in out:
        pytest.skip(f"{mode} is not available here: {out['unavailable']}")
    out["secret_value"] = secret
    out["survivors_after_death"] = wait_gone(out["markers"][2])
    return out


def _check(out: dict, mode: str, can_write: list[str], can_read: list[str]) -> None:
    """What holds in every mode (below); the writes that succeed: exactly ``can_write`` (of the paths the harness
    tried: home, /tmp, /var/tmp, /dev/shm, /etc, and ``project``: a folder the trainer's user may write); the
    trainer's user's files (mode 600) read: exactly ``can_read`` (``home``, ``project``)."""
    call = out["call"]
    assert isinstance(call, dict), call
    # the mounts stay: no umount of a cover, no read-write remount (no capability left)
    assert call["mounts"] == []
    # writes: checked on the host, not as the tool reports them (they agree)
    home, tmp, var_tmp, shm, etc, project = out["paths"]
    names = {"home": home, "tmp": tmp, "var_tmp": var_tmp, "shm": shm, "etc": etc, "project": project}
    assert sorted(out["exists"]) == sorted(names[k] for k in can_write), (mode, out["exists"])
    assert sorted(call["wrote"]) == sorted(out["exists"])
    secrets = dict(zip(["home", "project"], out["secrets"]))
    assert sorted(call["read"]) == sorted(secrets[k] for k in can_read), (mode, call["read"])
    # the folder of the tool's own file (in /tmp, mode 755, beside notes.txt, mode 644): in the ns-* modes the view
    # shows that one file there (bound back read-only), never the folder around it; the plain modes hide nothing, so
    # the folder is listed and read as its modes allow (documented)
    # (a __pycache__ folder may be there too: the tool servers write the bytecode they import)
    assert [n for n in out["tool_folder"] if n != "__pycache__"] == ["hostile_tools.py", "notes.txt"]
    if mode.startswith("ns-"):
        assert (call["folder"], call["beside"]) == (["hostile_tools.py"], []), (mode, call["folder"])
    else:
        seen = [n for n in call["folder"] if n != "__pycache__"]
        assert (seen, call["beside"]) == (["hostile_tools.py", "notes.txt"], ["notes.txt"]), (mode, call["folder"])
    # the call's own environment holds no secret: the server started without it
    assert "os.environ" not in call["secret"] and "/proc/self/environ" not in call["secret"]
    # the process tree: 30 children, each with one child of its own, left the group with setsid; none survives the
    # call's end, its time limit, or the trainer's death mid-call (when 60 were alive)
    assert call["forked"] == 30 and out["survivors_after_call"] == 0
    assert out["hang_status"] == "timeout" and out["survivors_after_timeout"] == 0
    assert out["forked_before_death"] >= 30 and out["survivors_after_death"] == 0


@pytest.mark.skipif(not ROOT, reason="needs root (run the tests as root for the ns-root and plain-nobody modes)")
@pytest.mark.parametrize("mode", ["ns-root", "plain-nobody", "plain"])
def test_a_hostile_tool_as_root(mode, open_folder):
    out = _hostile(mode, None, open_folder)
    assert out["uid"] == 0
    can_write = {"ns-root": [],  # read-only but its folder; /tmp, homes hidden
                 "plain-nobody": ["tmp", "var_tmp", "shm", "project"],  # as nobody: where nobody may (documented)
                 "plain": ["home", "tmp", "var_tmp", "shm", "etc", "project"]}[mode]  # fmt: skip
    # root's files: nobody reads none; plain (root without capabilities) reads them as their owner
    _check(out, mode, can_write, ["home", "project"] if mode == "plain" else [])
    # as root without capabilities a call cannot read another root process's /proc/<pid>/environ
    assert out["call"]["secret"] == {}


@pytest.mark.parametrize("mode", ["ns-user", "plain"])
def test_a_hostile_tool_as_a_user(mode, open_folder):
    user = _user() if ROOT else None
    if ROOT and user is None:
        pytest.skip("no non-root user to run as: create one (useradd -m rlvrtest) or set RLVR_TEST_USER")
    out = _hostile(mode, user, open_folder)
    assert out["uid"] != 0
    if mode == "ns-user":
        # the home is hidden; what the user may read elsewhere it reads (documented): the folder in /run, not the
        # harness's own one in /tmp (hidden too) when the tests do not run as root
        _check(out, mode, [], ["project"] if open_folder else [])
        assert out["call"]["secret"] == {}  # its own /proc: the trainer's processes are not there
    else:
        # plain: nothing confines files (documented); the trainer's /proc/<pid>/environ is readable (same user)
        _check(out, mode, ["home", "tmp", "var_tmp", "shm", "project"], ["home", "project"])
        assert out["call"]["secret"] and set(out["call"]["secret"].values()) == {out["secret_value"]}


# -- the opt-outs, the call's folder, the log line: one pool in this machine's best mode -----------------------------

SAMPLE = '''
"""Tools for the isolation tests."""
import os
import socket

from rlvr.tools.registry import access

OPEN = {open!r}
COUNT = []


def strict(path: str) -> str:
    """Report what this call reaches.

    Args:
        path: A file to write.
    """
    return _report(path)


@access(write=[OPEN], env=["RLVR_TEST_OPENED"], network=True)
def opened(path: str) -> str:
    """Report what this call reaches, with access opened.

    Args:
        path: A file to write.
    """
    return _report(path)


def _report(path):
    import json

    out = {{"env": os.environ.get("RLVR_TEST_OPENED"), "home": os.environ["HOME"], "cwd": os.getcwd(),
            "home_before": sorted(os.listdir(os.environ["HOME"])), "interfaces": [n for _, n in socket.if_nameindex()]}}
    with open(os.path.join(os.environ["HOME"], "mine"), "w") as f:
        f.write("x")
    try:
        with open(path, "w") as f:
            f.write("x")
        out["wrote"] = True
    except OSError as e:
        out["wrote"] = e.strerror
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
        out["socket"] = True
    except OSError as e:
        out["socket"] = str(e)
    import resource

    out["nproc"] = resource.getrlimit(resource.RLIMIT_NPROC)
    COUNT.append(1)
    out["count"] = len(COUNT)
    return json.dumps(out)
'''


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    folder = Path(__import__("tempfile").mkdtemp(prefix="rlvr-open-"))
    folder.chmod(0o777)  # as root, calls run as nobody
    root = tmp_path_factory.mktemp("isolation")
    (root / "tools_isolation.py").write_text(textwrap.dedent(SAMPLE.format(open=str(folder))))
    yield root / "tools_isolation.py", folder
    shutil.rmtree(folder, ignore_errors=True)


def test_opt_outs_the_calls_folder_and_the_log_line(sample, monkeypatch, caplog):
    f, folder = sample
    monkeypatch.setenv("RLVR_TEST_OPENED", "opened-value")
    strict, opened = resolve_tools([f"{f}:strict", f"{f}:opened"])
    assert strict.access == Access() and opened.access == Access(True, (str(folder),), (), ("RLVR_TEST_OPENED",))
    iso = machine_isolation()
    caplog.set_level("INFO", logger="rlvr")
    with ToolPool([strict, opened], num_workers=1, timeout_s=10.0, max_output_chars=10000) as pool:
        results = pool.run([(strict, {"path": str(folder / "a")}), (opened, {"path": str(folder / "b")}),
                            (strict, {"path": str(folder / "c")})])  # fmt: skip
    a, b, c = (json.loads(r.text) for r in results)
    assert [r.status for r in results] == ["ok"] * 3
    # the environment: the opted-in variable reaches only the tool that named it
    assert (a["env"], b["env"]) == (None, "opened-value")
    # the call's own folder is its cwd and HOME, and starts empty each call (the first call's file is gone)
    assert a["cwd"] == a["home"] and c["home_before"] == [] and a["home_before"] == []
    # module state starts afresh each call (the server's state after the import)
    assert (a["count"], c["count"]) == (1, 1)
    # the write opt-in; a strict tool's write is refused where the mode confines files
    assert b["wrote"] is True and (folder / "b").exists()
    if iso.namespaces:  # the folder is not in the strict tool's view: /tmp is an empty, read-only tmpfs there
        assert a["wrote"] == "No such file or directory" and not (folder / "a").exists()
    # the network: strict gets the audit hook, and in the ns-* modes a namespace with only a loopback device
    assert a["socket"] == "network access is disabled for tools" and b["socket"] is True
    if iso.namespaces:
        host = [n for _, n in __import__("socket").if_nameindex()]
        assert a["interfaces"] == ["lo"] and b["interfaces"] == host
    # the process budget: RLIMIT_NPROC is the calls' user's processes and threads at the server's start + 256, and
    # cannot be raised (for nobody, whose count is small and steady, the bound is checked by hand)
    assert a["nproc"][0] == a["nproc"][1]
    if iso.drops:
        assert NPROC_BUDGET <= a["nproc"][0] <= NPROC_BUDGET + tasks_of(nobody()[0]) + 64, a["nproc"]
    # the start-up lines name the mode, what holds, and each tool's opened access
    text = caplog.text
    assert f"tools: isolation {iso.mode} - files: " in text and "processes: " in text
    assert f"tool opened may also reach: network; writes {folder}; env RLVR_TEST_OPENED" in text
    # the tools' file lies in the hidden /tmp: the line names it as shown read-only, and not the folder around it
    if iso.namespaces:
        assert f"shown in them, read-only, for the tools' imports: " in text and f"{f} (a tool's file)" in text
        assert f"{f.parent} (" not in text
    assert "not set" not in text  # RLVR_TEST_OPENED is set


UNSET_SAMPLE = '''
from rlvr.tools.registry import access


@access(env=["RLVR_TEST_SET", "RLVR_TEST_UNSETT"])
def lookup(query: str) -> str:
    """Look something up.

    Args:
        query: What to look up.
    """
    return query


@access(env=["RLVR_TEST_UNSETT"])
class Keys:
    """A stateful tool: two methods, one declaration."""

    def first(self) -> str:
        """The first key."""
        return ""

    def second(self) -> str:
        """The second key."""
        return ""
'''


def test_an_env_variable_that_is_not_set_is_warned_once_per_tool(tmp_path, monkeypatch, caplog):
    """access(env=[NAME]) with NAME not set in the trainer's environment: one warning per tool at the pool's start,
    naming the tool, the variable, that it is not set, and the nearest set name (a typo); a set one: none."""
    monkeypatch.setenv("RLVR_TEST_SET", "set")
    monkeypatch.setenv("RLVR_TEST_UNSET", "the name meant")
    monkeypatch.delenv("RLVR_TEST_UNSETT", raising=False)
    (tmp_path / "unset_tools.py").write_text(UNSET_SAMPLE)
    tools = resolve_tools([f"{tmp_path}/unset_tools.py:lookup", f"{tmp_path}/unset_tools.py:Keys"])
    assert [t.name for t in tools] == ["lookup", "first", "second"]
    caplog.set_level("INFO", logger="rlvr")
    with ToolPool(tools, num_workers=1, timeout_s=10.0, max_output_chars=100):
        pass
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "not set" in r.getMessage()]
    tail = ("names a variable that is not set in the trainer's environment, so the tool will not see it; did you "
            "mean 'RLVR_TEST_UNSET'? (set it before the run, or fix the name)")
    assert warned == [f"tool lookup: access(env=['RLVR_TEST_UNSETT']) {tail}",
                      f"tool Keys: access(env=['RLVR_TEST_UNSETT']) {tail}"]


def test_the_access_declaration_is_checked(tmp_path):
    from rlvr.tools.registry import access, tool_access

    def f() -> None:
        pass

    for spec, needle in [(access(write=["relative/x"]), "not an absolute path"),
                         (access(read=[str(tmp_path / "missing")]), "not an absolute path to an existing folder"),
                         (access(env=["NOT-A-NAME"]), "not an environment variable name")]:  # fmt: skip
        with pytest.raises(ValueError, match=needle):
            tool_access(spec(f), "my_tools.py:f")


def test_the_unshare_command_of_each_mode():
    opened = Access(network=True)
    assert Isolation("ns-root").command(Access()) == ["unshare", "--mount", "--pid", "--fork", "--kill-child",
                                                      "--mount-proc", "--ipc", "--net"]  # fmt: skip
    assert Isolation("ns-user").command(opened) == ["unshare", "--map-root-user", "--mount", "--pid", "--fork",
                                                    "--kill-child", "--mount-proc", "--ipc"]  # fmt: skip
    assert Isolation("plain").command(Access()) == [] and Isolation("plain-nobody").command(Access()) == []
    with pytest.raises(ValueError, match="unknown tool isolation mode 'chroot'"):
        Isolation("chroot")
