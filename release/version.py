"""The version: pyproject.toml's `[project] version`, the one place it is written.

The installed package reports it (`importlib.metadata`: `slo_api.__version__`, both programs'
`--version`, the OpenAPI document); the release tools, which run from a checkout, read it here
(the image's tag and label, `make release`'s folder and files).
"""

from __future__ import annotations

from pathlib import Path

from release.lock import PYPROJECT, read_pyproject


def version(pyproject: Path = PYPROJECT) -> str:
    project = read_pyproject(pyproject)["project"]
    assert isinstance(project, dict)
    return str(project["version"])


if __name__ == "__main__":
    print(version())
