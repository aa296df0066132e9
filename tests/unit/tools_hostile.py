"""A hostile typed tool, and the script that runs it in a tool pool (tests/unit/test_tool_isolation.py).

The tool tries what a model-driven tool call could: undo its mounts, write outside its folder, read a secret from
the trainer's environment (its own, and every ``/proc/<pid>/environ``), list the folder its own file lies in and read
another file there, and fork children that leave its process group (``setsid``) and sleep, each named ``marker``
(``/proc/<pid>/comm``) so the script can count survivors.

    python tests/unit/tools_hostile.py MODE SECRET_NAME [FOLDER]   # prints one JSON line (below)
    python tests/unit/tools_hostile.py --become USER MODE SECRET_NAME [FOLDER]   # as root: the same, as USER

FOLDER: a folder the trainer's user may write that the isolation does not hide (the tool tries it too; default: a
new folder in the system's temporary folder, which the ``ns-*`` modes hide).

Run as a script it copies this file into a new folder in ``/tmp`` (mode 755, as a user's folder) beside a file
``notes.txt`` (mode 644), takes the tool from the copy (``/tmp/.../hostile_tools.py:hostile``), starts a pool in MODE
(``auto``: the machine's best) with one worker and:
1. calls the tool, which returns after forking: what it managed (it also tries to read two files holding the
   secret, mode 600: one in the trainer's home, one in FOLDER), and the survivors 10 s after the call;
2. calls it so that it hangs: the call's outcome, and the survivors after the time limit (2 s);
3. calls it to hang again on a second pool whose limit is far (60 s), and exits (``os._exit``) 1 s later,
   mid-call, as a trainer that dies: the caller counts the survivors of the third marker itself.

``--become USER`` (run as root): in a mount namespace of its own, hides ``/root`` behind a tmpfs with the
interpreter bound back (so USER can run it when ``/root`` is closed to others), then becomes USER and runs again.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

CHILDREN = 30
"""Children the tool forks (each forks one more): 60 processes, within the calls' process budget."""
TIMEOUT_S = 2.0


def hostile(paths: list, secrets: list, beside: list, secret_name: str, marker: str, hang: bool) -> str:
    """Try to escape (for the isolation tests).

    Args:
        paths: Files to create outside the call's folder.
        secrets: Files of the trainer's user to read.
        beside: Names of files beside this tool's own file to read.
        secret_name: The trainer's environment variable to look for.
        marker: The name the forked children take.
        hang: Never return after forking.
    """
    report = {"mounts": [], "wrote": [], "read": [], "secret": {}, "forked": 0, "beside": []}
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        report["folder"] = sorted(os.listdir(here))
    except OSError as e:
        report["folder"] = e.strerror
    for name in beside:
        try:
            with open(os.path.join(here, name)) as f:
                if f.read():
                    report["beside"].append(name)
        except OSError:
            pass
    libc = ctypes.CDLL(None, use_errno=True)
    for folder in ("/tmp", "/home", "/root"):
        if libc.umount2(folder.encode(), 2) == 0:  # MNT_DETACH
            report["mounts"].append(f"umount {folder}")
    if libc.mount(None, b"/", None, ctypes.c_ulong(32 | 4096), None) == 0:  # MS_REMOUNT | MS_BIND: read-write
        report["mounts"].append("remount / read-write")
    for p in paths:
        try:
            with open(p, "w") as f:
                f.write("escaped")
            report["wrote"].append(p)
        except OSError:
            pass
    for p in secrets:
        try:
            with open(p) as f:
                if f.read():
                    report["read"].append(p)
        except OSError:
            pass
    if secret_name in os.environ:
        report["secret"]["os.environ"] = os.environ[secret_name]
    for pid in os.listdir("/proc"):
        if pid.isdigit() or pid == "self":
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    for item in f.read().split(b"\0"):
                        if item.startswith(secret_name.encode() + b"="):
                            report["secret"][f"/proc/{pid}/environ"] = item.split(b"=", 1)[1].decode()
            except OSError:
                pass
    for _ in range(CHILDREN):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            os.setsid()
            libc.prctl(15, marker.encode(), 0, 0, 0)  # PR_SET_NAME
            try:
                os.fork()
            except OSError:
                pass
            libc.prctl(15, marker.encode(), 0, 0, 0)
            time.sleep(60)  # bounded: if containment fails they still end
            os._exit(0)
        report["forked"] += 1
    while hang:
        time.sleep(1)
    return json.dumps(report)


def survivors(marker: str) -> list[int]:
    """Processes named ``marker`` (in this PID namespace's view: the host's when run from it)."""
    out = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == marker:
                    with open(f"/proc/{pid}/stat") as g:
                        if g.read().rsplit(")", 1)[1].split()[0] != "Z":
                            out.append(int(pid))
        except (OSError, IndexError):
            pass
    return out


def wait_gone(marker: str, within_s: float = 10.0) -> int:
    """The survivors of ``marker`` once none is left or ``within_s`` has passed (the machine may be busy)."""
    end = time.monotonic() + within_s
    while survivors(marker) and time.monotonic() < end:
        time.sleep(0.1)
    return len(survivors(marker))


def become(user: str) -> None:
    """As root: run this script again as ``user`` (module docstring)."""
    import pwd
    import subprocess

    pw = pwd.getpwnam(user)
    base = os.path.realpath(sys.base_prefix)
    if base.startswith("/root/"):
        subprocess.run(["mount", "--make-rprivate", "/"], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/mnt"], check=True)  # in this namespace only
        keep = "/mnt/interpreter"
        os.makedirs(keep)
        subprocess.run(["mount", "--bind", base, keep], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/root"], check=True)
        os.makedirs(base, exist_ok=True)
        subprocess.run(["mount", "--bind", keep, base], check=True)
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    os.environ["HOME"] = pw.pw_dir
    os.environ.pop("TMPDIR", None)
    os.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[3:]])


def main() -> None:
    import shutil
    import tempfile
    import threading
    import uuid

    from rlvr.tools.execute import ToolPool
    from rlvr.tools.isolation import candidates, probe
    from rlvr.tools.registry import resolve_tools

    if sys.argv[1] == "--become":
        become(sys.argv[2])
    mode, secret_name = sys.argv[1], sys.argv[2]
    if mode not in candidates():
        print(json.dumps({"unavailable": f"{mode} is not a mode for uid {os.getuid()}"}), flush=True)
        return
    reason = probe(mode) if mode.startswith("ns-") else None
    if reason is not None:
        print(json.dumps({"unavailable": reason}), flush=True)
        return
    project = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="rlvr-project-")
    tok = uuid.uuid4().hex[:8]
    paths = [os.path.join(os.path.expanduser("~"), f"escape-{tok}"), f"/tmp/outside-{tok}", f"/var/tmp/outside-{tok}",
             f"/dev/shm/outside-{tok}", f"/etc/outside-{tok}", os.path.join(project, f"outside-{tok}")]
    markers = [f"rb{tok}{k}" for k in range(3)]
    secrets = [os.path.join(os.path.expanduser("~"), f".secret-{tok}"), os.path.join(project, f"secret-{tok}")]
    for p in secrets:
        with open(os.open(p, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(os.environ.get(secret_name, "secret"))
    tool_folder = tempfile.mkdtemp(prefix="rlvr-toolfolder-", dir="/tmp")
    os.chmod(tool_folder, 0o755)
    shutil.copy(os.path.abspath(__file__), os.path.join(tool_folder, "hostile_tools.py"))
    with open(os.open(os.path.join(tool_folder, "notes.txt"), os.O_WRONLY | os.O_CREAT, 0o644), "w") as f:
        f.write("a user's other file")
    (tool,) = resolve_tools([f"{tool_folder}/hostile_tools.py:hostile"])
    out: dict = {"uid": os.getuid(), "paths": paths, "secrets": secrets, "markers": markers, "pid": os.getpid(),
                 "tool_folder": sorted(os.listdir(tool_folder))}
    pool = ToolPool([tool], num_workers=1, timeout_s=TIMEOUT_S, max_output_chars=100000, isolation=mode)
    try:
        args = {"paths": paths, "secrets": secrets, "beside": ["notes.txt"], "secret_name": secret_name,
                "marker": markers[0], "hang": False}
        (r,) = pool.run([(tool, args)])
        out["call"] = json.loads(r.text) if r.status == "ok" else r.text
        out["exists"] = [p for p in paths if os.path.exists(p)]
        out["survivors_after_call"] = wait_gone(markers[0])
        (r,) = pool.run([(tool, {**args, "paths": [], "secrets": [], "marker": markers[1], "hang": True})])
        out["hang_status"] = r.status
        out["survivors_after_timeout"] = wait_gone(markers[1])
        pool.close()
        far = ToolPool([tool], num_workers=1, timeout_s=60.0, max_output_chars=100000, isolation=mode)
        threading.Thread(target=far.run, args=([(tool, {**args, "paths": [], "secrets": [], "marker": markers[2],
                                                                "hang": True})],),
                         daemon=True).start()  # fmt: skip
        time.sleep(1.0)
        out["forked_before_death"] = len(survivors(markers[2]))
    finally:
        for p in paths + secrets:
            try:
                os.unlink(p)
            except OSError:
                pass
        if len(sys.argv) <= 3 and not os.listdir(project):
            os.rmdir(project)
        shutil.rmtree(tool_folder, ignore_errors=True)
    print(json.dumps(out), flush=True)
    os._exit(0)  # the trainer dies mid-call: no close, no clean-up


if __name__ == "__main__":
    main()
