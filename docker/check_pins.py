"""Check that the installed packages satisfy an extra of pyproject.toml, version by version.

    python docker/check_pins.py cpu            # or gpu; run at the end of each image's build
    python docker/check_pins.py cpu --pyproject path/to/pyproject.toml

Prints one line per requirement of the extra (name, installed version, the pin) and exits 1 when one is missing
or outside its pin. Local version labels count as the version (torch 2.13.0+cpu satisfies torch==2.13.0, as in
PEP 440). Requirements whose environment marker does not hold here are skipped.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement


def check(extra: str, pyproject: Path) -> list[str]:
    """Problems with the installed packages against ``extra`` of ``pyproject`` (empty: all satisfied)."""
    spec = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    if extra not in spec:
        return [f"pyproject.toml has no extra {extra!r} (extras: {', '.join(spec)})"]
    problems = []
    for line in spec[extra]:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{req.name}: not installed (wanted {req.specifier})")
            continue
        ok = req.specifier.contains(have, prereleases=True)
        print(f"{'ok ' if ok else 'BAD'} {req.name} {have} ({req.specifier})")
        if not ok:
            problems.append(f"{req.name}: {have} installed, the {extra} extra pins {req.specifier}")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("extra", help="the extra of pyproject.toml: cpu or gpu")
    p.add_argument("--pyproject", type=Path, default=Path(__file__).resolve().parents[1] / "pyproject.toml")
    args = p.parse_args(argv)
    problems = check(args.extra, args.pyproject)
    for msg in problems:
        print(f"check_pins: {msg}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
