"""`python -m controlplane.gomod`: rewrite the kube-apiserver module's staging replaces.

k8s.io/kubernetes requires its staging modules at v0.0.0 and points them at ./staging with
replace directives, which Go ignores in a dependency. This reads k8s.io/kubernetes's own go.mod
from the module cache and replaces each `k8s.io/<name> v0.0.0` with the published v0.X.Y, then
lets Go tidy the requirements. Run it after changing the k8s.io/kubernetes version.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from controlplane.binaries import KUBE_APISERVER

_BLOCK = re.compile(r"\nreplace \(\n.*?\n\)\n", re.S)


def staging_modules(version: str) -> list[str]:
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    info = json.loads(
        subprocess.run(
            ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout
    )
    with open(info["GoMod"]) as handle:
        text = handle.read()
    return sorted(set(re.findall(r"^\s+(k8s\.io/[a-z0-9-]+) v0\.0\.0$", text, re.M)))


def main() -> int:
    version = KUBE_APISERVER.version()
    staging = "v0." + version.removeprefix("v1.")
    path = KUBE_APISERVER.module_dir / "go.mod"
    replaces = "".join(f"\t{m} => {m} {staging}\n" for m in staging_modules(version))
    text = _BLOCK.sub("\n", path.read_text()).rstrip("\n") + f"\n\nreplace (\n{replaces})\n"
    path.write_text(text)
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    subprocess.run(["go", "mod", "tidy"], cwd=KUBE_APISERVER.module_dir, check=True, env=env)
    print(f"{path}: {replaces.count(chr(10))} staging modules replaced with {staging}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
