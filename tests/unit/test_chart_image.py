"""The image the chart runs: what the Dockerfile copies exists, and the chart's commands are
ones the image provides. (No Docker here: the build itself runs elsewhere.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy/images/Dockerfile"


def test_copied_paths_exist_and_are_not_ignored() -> None:
    text = DOCKERFILE.read_text()
    sources = [line.split()[1] for line in text.splitlines()
               if line.startswith("COPY ") and "--from" not in line]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), src
    allowed = [line[1:].rstrip("/") for line in
               (ROOT / "deploy/images/Dockerfile.dockerignore").read_text().splitlines()
               if line.startswith("!")]
    for src in sources:
        assert any(src.rstrip("/") == a or src.startswith(f"{a}/") for a in allowed), src


def test_python_and_entry_point_match_the_project() -> None:
    text = DOCKERFILE.read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    version = re.search(r"^ARG PYTHON_VERSION=(\S+)", text, re.M)
    assert version and project["project"]["requires-python"] == f">={version.group(1)}"
    assert 'ENTRYPOINT ["choreo"]' in text
    assert project["project"]["scripts"]["choreo"] == "choreo.cli:main"
    # Every package directory pyproject maps must be in the build context.
    for package_dir in project["tool"]["setuptools"]["package-dir"].values():
        assert any(f"COPY {top}/" in text for top in (package_dir.split("/")[0],
                                                       package_dir)), package_dir
