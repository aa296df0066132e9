"""The ``code`` verifier: extraction, program assembly, scoring, and the sandbox against hostile completions.

Every adversarial completion is built so that it would score 1 if the attack worked (its ``check`` asserts the
attack's success); a score of 0 with the expected reason, within the time limit, is the containment.
Expected values are worked out by hand from the programs given here.
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import time
from pathlib import Path

import pytest

from rlvr.config import VerifierSpec
from rlvr.reward import build_verifier
from rlvr_verifiers._sandbox import Limits, isolation, run_python
from rlvr_verifiers.code import CodeVerifier, build_program, defines, extract_code

REPO = Path(__file__).resolve().parents[2]

# HumanEval/0, as published (prompt, canonical solution and test abridged to three asserts)
HE0 = {
    "prompt": (
        "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        '    """ Check if in given list of numbers, are any two numbers closer to each other than\n'
        '    given threshold.\n    """\n'
    ),
    "entry_point": "has_close_elements",
    "test": (
        "def check(candidate):\n"
        "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n"
        "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n"
        "    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 0.5) == False\n"
    ),
}
HE0_BODY = (
    "    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
    "            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n"
)
HE0_FULL = (
    "def has_close_elements(numbers, threshold):\n"
    "    s = sorted(numbers)\n"
    "    return any(y - x < threshold for x, y in zip(s, s[1:]))\n"
)
# a row whose test needs a helper defined only in the prompt (the shape of HumanEval/38)
HELPER_ROW = {
    "prompt": 'def enc(s: str):\n    return s[::-1]\n\n\ndef dec(s: str):\n    """Inverse of enc."""\n',
    "entry_point": "dec",
    "test": "def check(candidate):\n    assert candidate(enc('abc')) == 'abc'\n",
}


def run_adversarial(verifier: CodeVerifier, code: str):
    row = {"prompt": "", "entry_point": "candidate_fn", "test": "def check(c):\n    assert c() is True\n"}
    start = time.monotonic()
    result = verifier.verify(f"```python\n{code}\n```", "", **row)
    return result, time.monotonic() - start


@pytest.fixture(scope="module")
def cv() -> CodeVerifier:
    return CodeVerifier(timeout_s=3, memory_mb=256, max_output_bytes=1 << 16, nproc=32)


# ---------------------------------------------------------------------------------------------------------
# extraction and assembly


def test_extract_code_picks_the_last_python_fence():
    text = "First try:\n```python\nx = 1\n```\nBetter:\n```py\nx = 2\n```\nand shell:\n```bash\nls\n```\n"
    assert extract_code(text) == "x = 2\n"


def test_extract_code_untagged_fence_open_fence_and_plain_text():
    assert extract_code("Here:\n```\ny = 3\n```\ndone") == "y = 3\n"
    assert extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"  # cut off
    assert extract_code("    return 5\n") == "    return 5\n"  # raw continuation: the whole text


def test_defines_only_matches_a_top_level_def():
    assert defines("def dec(s):\n    pass\n", "dec")
    assert defines("async def dec(s):\n    pass\n", "dec")
    assert not defines("    def dec(s):\n        pass\n", "dec")
    assert not defines("def decode(s):\n    pass\n", "dec")


def test_build_program_full_function_keeps_the_prompt_helpers():
    program, tests, call = build_program("def dec(s):\n    return s[::-1]\n", "", HELPER_ROW)
    assert program.startswith(HELPER_ROW["prompt"]) and program.endswith("return s[::-1]\n")
    assert (tests, call) == (HELPER_ROW["test"], "dec")


def test_build_program_body_continues_the_prompt_and_is_reindented_when_needed():
    program, _, _ = build_program(HE0_BODY, "", HE0)
    assert program == HE0["prompt"] + HE0_BODY
    flat = "return len(numbers) > 99\n"  # a body the model wrote at column 0
    program, _, _ = build_program(flat, "", HE0)
    assert program == HE0["prompt"] + "    return len(numbers) > 99\n"


def test_build_program_mbpp_and_gold_as_tests():
    row = {"test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], "test_setup_code": "import math"}
    program, tests, call = build_program("def add(a, b):\n    return a + b\n", "", row)
    assert program == "import math\ndef add(a, b):\n    return a + b\n"
    assert (tests, call) == ("assert add(1, 2) == 3\nassert add(0, 0) == 0", None)
    assert build_program("x = 1", "assert x == 1", {}) == ("x = 1", "assert x == 1", None)


# ---------------------------------------------------------------------------------------------------------
# scoring


def test_humaneval_full_function_body_and_wrong(cv):
    assert cv.verify(f"Sorted neighbours suffice:\n```python\n{HE0_FULL}```", "", **HE0).score == 1.0
    assert cv.verify(HE0_BODY, "", **HE0).score == 1.0
    wrong = cv.verify("    return True\n", "", **HE0)  # the second assert expects False
    assert (wrong.score, wrong.reason) == (0.0, "failed: AssertionError")
    assert cv.verify("def dec(s):\n    return s[::-1]\n", "", **HELPER_ROW).score == 1.0


def test_reasons_for_bad_programs(cv):
    assert cv.verify("", "", **HE0).reason == "no_code"
    assert cv.verify("```python\n\n```", "", **HE0).reason == "no_code"
    assert cv.verify("```python\ndef has_close_elements(:\n```", "", **HE0).reason == "failed: SyntaxError"
    assert cv.verify("    return undefined_name\n", "", **HE0).reason == "failed: NameError"
    assert cv.verify("x = 1", "", **{}).reason == "no_tests"
    assert cv.verify("```python\nimport sys\nsys.exit(0)\n```", "", **HE0).reason == "failed: SystemExit"
    # leaving before the tests ran is not a pass
    assert cv.verify("```python\nimport os\nos._exit(0)\n```", "", **HE0).reason == "crashed"


def test_mbpp_row_and_gold_asserts(cv):
    row = {"test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], "test_setup_code": ""}
    assert cv.verify("```python\ndef add(a, b):\n    return a + b\n```", "", **row).score == 1.0
    bad = cv.verify("```python\ndef add(a, b):\n    return a - b\n```", "", **row)
    assert (bad.score, bad.reason) == (0.0, "failed: AssertionError")  # 1 - 2 = -1 != 3
    assert cv.verify("def sq(x):\n    return x * x\n", "assert sq(7) == 49", **{}).score == 1.0


def test_registered_as_code_builtin():
    v = build_verifier(VerifierSpec(name="code", args={"timeout_s": 4, "nproc": 16}))
    assert isinstance(v, CodeVerifier)
    assert (v.limits.timeout_s, v.limits.nproc, v.limits.memory_mb) == (4.0, 16, 512)
    with pytest.raises(ValueError):
        CodeVerifier(timeout_s=0)


def test_temp_folder_is_cwd_and_deleted():
    r = run_python("import os\nprint(os.getcwd())\nopen('mine.txt', 'w').write('ok')\n", "", None, Limits())
    assert r.status == "ok"
    cwd = r.output.decode().strip()
    assert Path(cwd).name.startswith("rlvr-code-") and not os.path.exists(cwd)


def test_environment_is_stripped():
    r = run_python("import os\nprint(sorted(os.environ))\n", "", None, Limits())
    assert r.output.decode().strip() == "['HOME', 'LANG', 'PATH']"


# ---------------------------------------------------------------------------------------------------------
# hostile completions: each scored 0, within the limit


def test_infinite_loop_times_out_within_the_limit():
    v = CodeVerifier(timeout_s=1.5)
    for code in ("def candidate_fn():\n    while True:\n        pass", "import time\ntime.sleep(100)"):
        result, elapsed = run_adversarial(v, code)
        assert (result.score, result.reason) == (0.0, "timeout")
        assert 1.5 <= elapsed < 1.5 + 2.0, elapsed


def _live_procs_named(comm: str) -> list[int]:
    """Processes named ``comm`` that are not zombies (killed ones linger as zombies until reaped)."""
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "comm").read_text().strip() == comm:
                state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    pids.append(int(p.name))
        except (OSError, IndexError):
            continue
    return pids


def test_fork_bomb_is_contained_and_cleaned_up():
    iso = isolation()
    if iso.drop is None and os.geteuid() == 0:
        pytest.skip(f"isolation {iso.mode} runs as root, which RLIMIT_NPROC does not bind: no fork bomb here")
    comm = "rlvrbomb" + secrets.token_hex(3)  # 14 characters: fits in comm (15)
    v = CodeVerifier(timeout_s=2, nproc=16)
    # bounded first: 40 forks against a limit of 16 processes fail with BlockingIOError, and nothing is left
    bounded = "import os, time\nfor _ in range(40):\n    if os.fork() == 0:\n        time.sleep(30)\n        os._exit(0)"
    result, elapsed = run_adversarial(v, bounded)
    assert (result.score, result.reason) == (0.0, "failed: BlockingIOError") and elapsed < 4.0
    bomb = (
        f"import ctypes, os\nctypes.CDLL(None).prctl(15, b'{comm}', 0, 0, 0)\n"
        "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    )
    result, elapsed = run_adversarial(v, bomb)
    assert (result.score, result.reason) == (0.0, "timeout")
    assert elapsed < 2 + 2.0, elapsed
    # every process of the bomb is gone within a deadline (0.5 s was too short once beside a training run on the
    # 2 cores: the killed processes were still being reaped)
    deadline = time.monotonic() + 10.0
    while _live_procs_named(comm) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert _live_procs_named(comm) == []


def test_unbounded_allocation_scores_memory(cv):
    for code in (
        "x = bytearray(8 * 2**30)\ndef candidate_fn():\n    return True",
        "keep = []\nwhile True:\n    keep.append(bytearray(2**24))",
    ):
        result, elapsed = run_adversarial(cv, code)
        assert (result.score, result.reason) == (0.0, "memory")
        assert elapsed < 3 + 2.0


def _write_attempt(path: str) -> str:
    return (
        "def candidate_fn():\n"
        "    try:\n"
        f"        with open({path!r}, 'w') as f:\n"
        "            f.write('escaped')\n"
        "        return True\n"
        "    except OSError:\n"
        "        return False\n"
    )


@pytest.mark.parametrize("where", ["tmp", "repo", "parent_of_cwd"])
def test_writing_outside_the_folder_fails(cv, where):
    iso = isolation()
    if iso.drop is None:
        pytest.skip(f"isolation {iso.mode}: runs as the calling user, who may write there")
    if where == "tmp" and not iso.covers:
        pytest.skip(f"isolation {iso.mode}: /tmp is world-writable and not covered")
    name = f"rlvr_escape_{secrets.token_hex(4)}"
    if where == "parent_of_cwd":
        code = _write_attempt("PLACEHOLDER").replace("'PLACEHOLDER'", f"'../{name}'")
        target = Path(tempfile.gettempdir()) / name  # where the run folders are created
    else:
        target = Path("/tmp" if where == "tmp" else REPO) / name
        code = _write_attempt(str(target))
    result, elapsed = run_adversarial(cv, code)
    assert (result.score, result.reason) == (0.0, "failed: AssertionError")
    assert not target.exists()
    # control: the same attempt inside its own folder succeeds (score 1)
    assert run_adversarial(cv, _write_attempt(name))[0].score == 1.0


def test_reading_the_tests_from_disk_fails(cv):
    secret = "SECRET-" + secrets.token_hex(8)
    search = (
        "import os\n"
        "def scan(root, depth):\n"
        "    try:\n        names = os.listdir(root)\n    except OSError:\n        return None\n"
        "    for n in names:\n"
        "        p = os.path.join(root, n)\n"
        "        try:\n"
        "            if os.path.isdir(p) and not os.path.islink(p) and depth:\n"
        "                hit = scan(p, depth - 1)\n"
        "                if hit:\n                    return hit\n"
        "            elif os.path.isfile(p):\n"
        "                data = open(p, 'rb').read(1 << 20).decode('latin-1')\n"
        "                i = data.find('SECRET-')\n"
        "                if i >= 0 and data[i + 7 : i + 23].isalnum():\n                    return data[i : i + 23]\n"
        "        except OSError:\n            pass\n"
        "def candidate_fn():\n"
        "    for root, depth in (('.', 3), ('..', 1), ('/tmp', 1), ('/proc/self/fd', 0)):\n"
        "        hit = scan(root, depth)\n"
        "        if hit:\n            return hit\n"
        "    for pid in os.listdir('/proc'):\n"
        "        for f in ('cmdline', 'environ'):\n"
        "            try:\n"
        "                data = open('/proc/%s/%s' % (pid, f), 'rb').read().decode('latin-1')\n"
        "            except OSError:\n                continue\n"
        "            i = data.find('SECRET-')\n"
        "            if i >= 0 and data[i + 7 : i + 23].isalnum():\n                return data[i : i + 23]\n"
    )
    row = {"prompt": "", "entry_point": "candidate_fn", "test": f"def check(c):\n    assert c() == {secret!r}\n"}
    result = cv.verify(f"```python\n{search}```", "", **row)
    assert (result.score, result.reason) == (0.0, "failed: AssertionError")
    # control: the same search finds a secret planted in its own folder, so it would have found a test file
    planted = "SECRET-" + secrets.token_hex(8)
    plant = f"open('planted.txt', 'w').write({planted!r})\n"
    control = {"prompt": "", "entry_point": "candidate_fn", "test": f"def check(c):\n    assert c() == {planted!r}\n"}
    assert cv.verify(f"```python\n{plant}{search}```", "", **control).score == 1.0


def test_socket_connect_to_localhost_fails(cv):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "def candidate_fn():\n"
            "    try:\n"
            f"        socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
            "        return True\n"
            "    except OSError:\n"
            "        return False\n"
        )
        result, elapsed = run_adversarial(cv, code)
        assert (result.score, result.reason) == (0.0, "failed: AssertionError")
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody connected
            server.accept()


def test_huge_stdout_is_capped(cv):
    code = "def candidate_fn():\n    while True:\n        print('x' * 65536)\n"
    result, elapsed = run_adversarial(cv, code)
    assert (result.score, result.reason) == (0.0, "output_limit")
    assert elapsed < 3.0
    r = run_python("import sys\nsys.stdout.write('y' * 200000)\n", "", None, Limits(max_output_bytes=1000))
    assert r.status == "output_limit" and r.output == b"y" * 1000


def test_never_raises_on_odd_input(cv):
    assert cv.verify("```python\nx = '\x00'\n```", "", **HE0).score == 0.0
    assert cv.verify("def f(:\n" * 1000, "", **HE0).reason == "failed: SyntaxError"
    assert cv.verify("((((" * 500 + "1" + "))))" * 500, "", **HE0).score == 0.0
