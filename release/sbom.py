"""The SBOM of a release: CycloneDX 1.5 JSON of what the image installs, from requirements.lock.

One component per pinned distribution of the lock (exactly the versions the image holds, its
test checks that), with its package URL and every SHA-256 the lock accepts for it, and the
application itself as the subject. The lock records no dependency graph (it is resolved without
annotations), so the SBOM states none. Its time and serial number derive from the commit and
the lock, so two runs on one commit write the same file.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release.lock import RUNTIME

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s\\;]+)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
SPEC_VERSION = "1.5"


@dataclass
class Pinned:
    name: str
    version: str
    hashes: list[str] = field(default_factory=list)


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares it (and a pypi package URL spells it)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(lock_text: str) -> list[Pinned]:
    """Each `name==version` of a lock with the hashes listed under it."""
    found: list[Pinned] = []
    for line in lock_text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pin = PIN.match(stripped)
        if pin:
            found.append(Pinned(canonical(pin[1]), pin[2]))
        elif found:
            found[-1].hashes += HASH.findall(stripped)
    return found


def _purl(name: str, version: str) -> str:
    return f"pkg:pypi/{name}@{version}"


def sbom(name: str, version: str, lock_text: str, created: str) -> dict[str, Any]:
    """The CycloneDX document of `name` `version` whose runtime is the lock `lock_text`;
    `created` is an RFC 3339 time (the commit's)."""
    components = [
        {
            "type": "library",
            "bom-ref": _purl(p.name, p.version),
            "name": p.name,
            "version": p.version,
            "purl": _purl(p.name, p.version),
            "hashes": [{"alg": "SHA-256", "content": h} for h in p.hashes],
        }
        for p in sorted(pinned(lock_text), key=lambda p: p.name)
    ]
    digest = hashlib.sha256(f"{name} {version}\n{lock_text}".encode()).hexdigest()
    return {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": f"urn:uuid:{uuid.UUID(digest[:32], version=5)}",
        "version": 1,
        "metadata": {
            "timestamp": created,
            "tools": {"components": [{"type": "application", "name": "release.sbom"}]},
            "component": {
                "type": "application",
                "bom-ref": _purl(canonical(name), version),
                "name": name,
                "version": version,
                "purl": _purl(canonical(name), version),
            },
        },
        "components": components,
    }


def write(path: Path, name: str, version: str, created: str, lock: Path = RUNTIME.path) -> None:
    document = sbom(name, version, lock.read_text(), created)
    path.write_text(json.dumps(document, indent=2) + "\n")
