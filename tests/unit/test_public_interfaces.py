"""slo_api uses the libraries it runs on (uvicorn, Starlette, FastAPI, aiohttp) through their
public interfaces only: a renamed private attribute in a minor release must not fail a request.

The scan reads every module's syntax tree and flags:
- an attribute whose name starts with `_` read or written on something other than `self`,
  `cls`, or an object of slo_api's own (a private name slo_api itself defines);
- reaching into a callable or an object past its interface (`__self__`, `__closure__`,
  `__globals__`, `__code__`, `getattr`/`setattr` with a private name);
- a module of those libraries that is not public, imported or named in a string (as a check
  of `type(x).__module__` would).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path

import slo_api

PACKAGE = Path(slo_api.__file__).parent
LIBRARIES = ("uvicorn", "starlette", "fastapi", "aiohttp")
# uvicorn documents `uvicorn.run`, `Config` and `Server`; the rest of it is its own.
PUBLIC_UVICORN = ("uvicorn", "uvicorn.config", "uvicorn.main")
# Private names that belong to none of those libraries, each with why it is used.
ALLOWED = {
    # asyncio's protocol for future-like objects (documented with asyncio.isfuture): how a
    # task is told what it waits for, done by hand by the write pump (feed/pump.py).
    "_asyncio_future_blocking",
}
INTROSPECTION = ("__self__", "__closure__", "__globals__", "__code__", "__func__")
LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def own_private_names(trees: list[ast.Module]) -> set[str]:
    """The private names slo_api defines: functions, methods, classes, attributes it sets."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return {n for n in names if n.startswith("_")}


def _internal_module(name: str) -> bool:
    parts = name.split(".")
    if parts[0] not in LIBRARIES:
        return False
    if any(p.startswith("_") for p in parts):
        return True
    return parts[0] == "uvicorn" and name not in PUBLIC_UVICORN


def findings(tree: ast.Module, own: set[str], where: str) -> list[str]:
    found: list[str] = []

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"{where}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = node.attr
            if name in INTROSPECTION:
                flag(node, f"reaches into an object through {name}")
            elif name.startswith("_") and not name.startswith("__") and name not in ALLOWED:
                on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if not on_self and name not in own:
                    flag(node, f"private attribute {name} of an object not slo_api's")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2:
                key = node.args[1]
                text = key.value if isinstance(key, ast.Constant) else None
                if isinstance(text, str) and (
                    text in INTROSPECTION or (text.startswith("_") and text not in own | ALLOWED)
                ):
                    flag(node, f"{node.func.id} of {text}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _internal_module(alias.name):
                    flag(node, f"imports {alias.name}, not a public module")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if _internal_module(node.module):
                flag(node, f"imports from {node.module}, not a public module")
            elif node.module.split(".")[0] in LIBRARIES:
                for alias in node.names:
                    if alias.name.startswith("_"):
                        flag(node, f"imports {alias.name} from {node.module}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text not in LOGGERS and " " not in text and _internal_module(text):
                flag(node, f"names {text}, not a public module")
    return found


def _imports(tree: ast.Module) -> dict[str, str]:
    """The dotted name each imported name of a module stands for."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _library_class(base: ast.expr, imports: dict[str, str]) -> type | None:
    """The library class a base-class expression names (`uvicorn.Server`), if it is one."""
    parts: list[str] = []
    while isinstance(base, ast.Attribute):
        parts.append(base.attr)
        base = base.value
    if not isinstance(base, ast.Name):
        return None
    dotted = ".".join([imports.get(base.id, base.id), *reversed(parts)])
    module, _, name = dotted.rpartition(".")
    if module.split(".")[0] not in LIBRARIES:
        return None
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    return found if isinstance(found, type) else None


def _private_names_of(cls: type) -> set[str]:
    """The private names a library class and its library bases define: class attributes and
    those their methods set on `self`."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] not in LIBRARIES:
            continue
        names |= {n for n in vars(klass) if n.startswith("_") and not n.startswith("__")}
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                names.add(node.attr)
    return names


def inherited(tree: ast.Module, where: str) -> list[str]:
    """A subclass of a library class using a private name of that class through `self`."""
    found: list[str] = []
    imports = _imports(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        private: set[str] = set()
        for base in node.bases:
            cls = _library_class(base, imports)
            if cls is not None:
                private |= _private_names_of(cls)
        for inner in ast.walk(node):
            if (
                isinstance(inner, ast.Attribute)
                and isinstance(inner.value, ast.Name)
                and inner.value.id in ("self", "cls")
                and inner.attr in private
            ):
                found.append(
                    f"{where}:{inner.lineno}: private attribute {inner.attr} of the library "
                    f"class {node.name} subclasses"
                )
    return found


def scan(sources: dict[str, str]) -> list[str]:
    trees = {where: ast.parse(text) for where, text in sources.items()}
    own = own_private_names(list(trees.values()))
    return [
        f
        for where, tree in trees.items()
        for f in [*findings(tree, own, where), *inherited(tree, where)]
    ]


def package_sources() -> dict[str, str]:
    return {
        str(path.relative_to(PACKAGE.parent)): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_slo_api_uses_no_private_attribute_or_module_of_its_web_and_http_libraries() -> None:
    assert scan(package_sources()) == []


# What slo-api once did (the direct writes onto uvicorn's request cycle, and the seam's
# session setting): the scan must see each.
DIRECT_WRITE = """
from starlette.types import Send

_HTTPTOOLS = "uvicorn.protocols.http.httptools_impl"


def write_now(send: Send):
    cycle = getattr(send, "__self__", None)
    if cycle is None or type(cycle).__module__ != _HTTPTOOLS:
        return None
    transport, flow = cycle.transport, cycle.flow
    return transport.write
"""
TRUST_ENV = """
def connect(api_client):
    api_client.rest_client.pool_manager._trust_env = False
"""
CYCLE_IMPORT = "from uvicorn.protocols.http.httptools_impl import RequestResponseCycle\n"
PRIVATE_IMPORT = "from starlette._utils import is_async_callable\n"
# A SIGTERM that drained cleanly made to exit 0 by editing uvicorn's list of signals to raise
# again: a private attribute of the class it subclasses, reached through `self`.
INHERITED = """
import uvicorn


class Server(uvicorn.Server):
    def stop(self, sig):
        self._captured_signals = [s for s in self._captured_signals if s != sig]
"""


def test_the_scan_finds_what_slo_api_once_did_and_what_it_must_not_do() -> None:
    sources = package_sources()
    for name, text in {
        "direct_write.py": DIRECT_WRITE,
        "kube.py": TRUST_ENV,
        "cycle.py": CYCLE_IMPORT,
        "utils.py": PRIVATE_IMPORT,
        "server.py": INHERITED,
    }.items():
        found = scan({**sources, f"old/{name}": text})
        assert found, name
        assert all(f.startswith(f"old/{name}:") for f in found), found
    direct = scan({**sources, "old/direct_write.py": DIRECT_WRITE})
    assert any("__self__" in f for f in direct)
    assert any("uvicorn.protocols.http.httptools_impl" in f for f in direct)
    assert any("_trust_env" in f for f in scan({**sources, "old/kube.py": TRUST_ENV}))
