"""The bearer token of a kubeconfig's current context, for slo-api's Kubernetes identities.

Reads what `kubectl` would send: the user's `token`, its `tokenFile`, or the token an exec
credential plugin prints (`kubectl create token`, cloud login helpers). Client certificates
and auth-provider entries carry no bearer token and are refused with a hint.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slo_api.cli.errors import CliError, ExitCode, usage

EXEC_TIMEOUT = 60.0
Obj = dict[str, Any]


def _load(path: Path) -> Obj:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise usage(f"cannot read the kubeconfig {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise usage(f"the kubeconfig {path} is not YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise usage(f"the kubeconfig {path} is not a kubeconfig")
    return data


def _named(configs: list[tuple[Path, Obj]], section: str, name: str) -> tuple[Path, Obj] | None:
    """The first entry of that name across the files, as kubectl merges them."""
    for path, config in configs:
        for entry in config.get(section) or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                key = section.rstrip("s")
                value = entry.get(key) or {}
                return path, value if isinstance(value, dict) else {}
    return None


@dataclass(frozen=True)
class KubeCredential:
    """A kubeconfig context's bearer token, and which context and user it came from."""

    token: str
    context: str
    user: str

    def __repr__(self) -> str:
        return f"KubeCredential(context={self.context!r}, user={self.user!r})"


def loopback(server: str) -> bool:
    """True when `server` names this machine (localhost, 127.0.0.0/8 or ::1)."""
    host = urllib.parse.urlsplit(server).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_transport(server: str, credential: KubeCredential) -> None:
    """Refuse to send a cluster credential where anyone on the way could read it.

    A kubeconfig token is good for the cluster too (unless minted for slo-api's audience):
    over plain HTTP to another host it could be read and replayed. Loopback is fine (a
    port-forward, a local run).
    """
    if urllib.parse.urlsplit(server).scheme.lower() == "https" or loopback(server):
        return
    raise usage(
        f"refusing to send the credentials of kubeconfig context {credential.context!r} over "
        f"plain HTTP to {server}: use an https:// server, a port-forward to localhost, or "
        "pass a token minted for slo-api (--token-file)"
    )


def token_from_kubeconfig(paths: str, context: str | None = None) -> KubeCredential:
    """The token of the (current) context of a KUBECONFIG-style list of files."""
    files = [Path(p).expanduser() for p in paths.split(os.pathsep) if p]
    configs = [(p, _load(p)) for p in files if p.exists() or len(files) == 1]
    if not configs:
        raise usage(f"no kubeconfig found at {paths}")
    name = context or next(
        (c["current-context"] for _, c in configs if c.get("current-context")), None
    )
    if not name:
        raise usage("the kubeconfig has no current-context")
    found = _named(configs, "contexts", str(name))
    if found is None:
        raise usage(f"the kubeconfig has no context {name!r}")
    user_name = found[1].get("user")
    user = _named(configs, "users", str(user_name)) if user_name else None
    if user is None:
        raise usage(f"the kubeconfig's context {name!r} names no known user")
    return KubeCredential(_token_of(user[0], user[1], str(user_name)), str(name), str(user_name))


def _token_of(path: Path, user: Obj, name: str) -> str:
    if user.get("token"):
        return str(user["token"]).strip()
    if user.get("tokenFile"):
        token_file = path.parent / str(user["tokenFile"])
        try:
            return token_file.read_text().strip()
        except OSError as exc:
            raise usage(f"cannot read the tokenFile of user {name!r}: {exc.strerror}") from None
    if isinstance(user.get("exec"), dict):
        return _exec_token(path, user["exec"], name)
    raise usage(
        f"the kubeconfig's user {name!r} has no bearer token (client certificates cannot be "
        "sent to slo-api): use `kubectl create token`, or pass --token"
    )


def _exec_token(path: Path, spec: Obj, name: str) -> str:
    command = str(spec.get("command") or "")
    if not command:
        raise usage(f"the exec credential plugin of user {name!r} names no command")
    if os.sep in command and not os.path.isabs(command):
        command = str(path.parent / command)
    env = dict(os.environ)
    for pair in spec.get("env") or []:
        if isinstance(pair, dict) and "name" in pair:
            env[str(pair["name"])] = str(pair.get("value", ""))
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {
            "apiVersion": spec.get("apiVersion", "client.authentication.k8s.io/v1"),
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
    )
    try:
        # The command the kubeconfig names, run as kubectl runs it.
        done = subprocess.run(
            [command, *(str(a) for a in spec.get("args") or [])],
            env=env,
            capture_output=True,
            timeout=EXEC_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CliError(
            f"the exec credential plugin {command!r} failed: {exc}", ExitCode.AUTH
        ) from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()[-300:]
        raise CliError(
            f"the exec credential plugin {command!r} exited {done.returncode}: {said}",
            ExitCode.AUTH,
        )
    try:
        token = json.loads(done.stdout)["status"]["token"]
    except (ValueError, KeyError, TypeError):
        raise CliError(
            f"the exec credential plugin {command!r} printed no ExecCredential with a token",
            ExitCode.AUTH,
        ) from None
    return str(token)
