"""The image installs exactly what requirements.lock pins, so the lock must follow pyproject.toml.

Staleness is told without the network: each lock records a digest of the pyproject.toml inputs
it was resolved from, and every top-level requirement must be pinned at a version it allows.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from release import lock as locks

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def _pins(path: Path) -> dict[str, str]:
    return {
        canonicalize_name(m[1]): m[2]
        for line in path.read_text().splitlines()
        if (m := PIN.match(line))
    }


def _entries(path: Path) -> list[str]:
    """Each requirement with its continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_the_locks_match_pyproject() -> None:
    problems = locks.stale_locks()
    assert problems == [], f"{'; '.join(problems)}: run `make lock` and commit the result"


@pytest.mark.parametrize("lock", locks.LOCKS, ids=lambda lock: lock.path.name)
def test_every_requirement_is_pinned_at_an_allowed_version(lock: locks.Lock) -> None:
    pins = _pins(lock.path)
    for text in lock.inputs(locks.read_pyproject()):
        wanted = Requirement(text)
        name = canonicalize_name(wanted.name)
        assert name in pins, f"{wanted.name} is not in {lock.path.name}: run `make lock`"
        assert wanted.specifier.contains(pins[name], prereleases=True), (
            f"{lock.path.name} pins {wanted.name}=={pins[name]}, outside {wanted.specifier}: "
            "run `make lock`"
        )


@pytest.mark.parametrize("lock", locks.LOCKS, ids=lambda lock: lock.path.name)
def test_every_entry_is_an_exact_version_with_hashes(lock: locks.Lock) -> None:
    entries = _entries(lock.path)
    assert entries
    for entry in entries:
        assert PIN.match(entry), entry
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry), entry


def test_a_changed_dependency_makes_the_lock_stale() -> None:
    pyproject = locks.read_pyproject()
    assert locks.stale_locks(pyproject) == []
    project = pyproject["project"]
    assert isinstance(project, dict)

    reordered = dict(pyproject, project=dict(project, dependencies=project["dependencies"][::-1]))
    assert locks.stale_locks(reordered) == []

    added = dict(project, dependencies=[*project["dependencies"], "rich>=13"])
    problems = locks.stale_locks(dict(pyproject, project=added))
    assert [p.split()[0] for p in problems] == ["requirements.lock"]

    tightened = [*project["dependencies"]]
    tightened[0] += ",<0.1"
    problems = locks.stale_locks(dict(pyproject, project=dict(project, dependencies=tightened)))
    assert [p.split()[0] for p in problems] == ["requirements.lock"]

    build = dict(pyproject["build-system"], requires=["hatchling>=2"])  # type: ignore[call-overload]
    problems = locks.stale_locks(dict(pyproject, **{"build-system": build}))
    assert [p.split()[0] for p in problems] == ["requirements-build.lock"]


def test_the_image_base_is_the_python_the_lock_was_resolved_for() -> None:
    dockerfile = (locks.REPO / "Dockerfile").read_text()
    default = re.search(r"^ARG PYTHON_IMAGE=(\S+)", dockerfile, re.M)
    assert default, "the Dockerfile takes its base image as ARG PYTHON_IMAGE"
    # The official slim image of that minor version, pinned by digest (the tag says which).
    image = re.fullmatch(
        r"(?:docker\.io/library/)?python:(\d+\.\d+)(?:\.\d+)?-slim[\w-]*@sha256:[0-9a-f]{64}",
        default[1],
    )
    assert image, default[1]
    assert image[1] == locks.PYTHON_VERSION
    requires = tomllib.loads(locks.PYPROJECT.read_text())["project"]["requires-python"]
    assert SpecifierSet(requires).contains(locks.PYTHON_VERSION)
