"""The module specifiers an ES module imports, however the import is written.

A small scanner, not a regular expression: comments, strings, template literals and regular
expression literals are skipped as JavaScript reads them, so an `import` inside one is no
import, and one spread over lines is still one. It knows the four forms that load a module:
`import ... from "x"`, `import "x"`, `export ... from "x"` and `import("x")`; a dynamic import
of anything but a string literal cannot be followed and is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

# After these a `/` starts a regular expression; after anything else it divides.
_REGEX_AFTER_WORDS = frozenset(
    [
        "return",
        "typeof",
        "instanceof",
        "in",
        "of",
        "new",
        "delete",
        "void",
        "throw",
        "case",
        "do",
        "else",
        "yield",
        "await",
    ]
)
_CLOSERS = frozenset(")]}")


class ScanError(ValueError):
    """The source loads a module in a way that cannot be followed, or does not scan."""


@dataclass(frozen=True)
class Token:
    kind: str  # "word", "string", "punct", "template" or "regex"
    text: str  # a string's value; the character of a punctuator; a word


def tokens(source: str) -> list[Token]:
    out: list[Token] = []
    # Open template literals: the brace depth at which each `${` began.
    templates: list[int] = []
    depth = 0
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c.isspace():
            i += 1
        elif source.startswith("//", i):
            end = source.find("\n", i)
            i = n if end < 0 else end
        elif source.startswith("/*", i):
            end = source.find("*/", i + 2)
            if end < 0:
                raise ScanError("unterminated comment")
            i = end + 2
        elif c in "'\"":
            value, i = _string(source, i)
            out.append(Token("string", value))
        elif c == "`" or (c == "}" and templates and templates[-1] == depth):
            if c == "}":
                templates.pop()
            i = _template(source, i + 1, templates, depth)
            if not (templates and templates[-1] == depth):
                out.append(Token("template", ""))
        elif c == "/" and _regex_allowed(out):
            i = _regex(source, i)
            out.append(Token("regex", ""))
        elif c.isalnum() or c in "_$":
            j = i
            while j < n and (source[j].isalnum() or source[j] in "_$"):
                j += 1
            out.append(Token("word", source[i:j]))
            i = j
        else:
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            out.append(Token("punct", c))
            i += 1
    if templates:
        raise ScanError("unterminated template literal")
    return out


def _string(source: str, i: int) -> tuple[str, int]:
    quote, j, chars = source[i], i + 1, []
    while j < len(source):
        c = source[j]
        if c == "\\":
            chars.append(source[j : j + 2])
            j += 2
        elif c == quote:
            return "".join(chars), j + 1
        elif c == "\n":
            break
        else:
            chars.append(c)
            j += 1
    raise ScanError("unterminated string")


def _template(source: str, j: int, templates: list[int], depth: int) -> int:
    """Skips template text from j to its closing backquote, or to a `${` (then pushed)."""
    while j < len(source):
        c = source[j]
        if c == "\\":
            j += 2
        elif c == "`":
            return j + 1
        elif source.startswith("${", j):
            templates.append(depth)
            return j + 2
        else:
            j += 1
    raise ScanError("unterminated template literal")


def _regex_allowed(before: list[Token]) -> bool:
    if not before:
        return True
    last = before[-1]
    if last.kind == "word":
        return last.text in _REGEX_AFTER_WORDS
    if last.kind == "punct":
        return last.text not in _CLOSERS
    return False


def _regex(source: str, i: int) -> int:
    j, in_class = i + 1, False
    while j < len(source):
        c = source[j]
        if c == "\\":
            j += 2
            continue
        if c == "\n":
            break
        if c == "[":
            in_class = True
        elif c == "]":
            in_class = False
        elif c == "/" and not in_class:
            j += 1
            while j < len(source) and (source[j].isalnum() or source[j] == "_"):
                j += 1
            return j
        j += 1
    raise ScanError("unterminated regular expression")


def specifiers(source: str) -> list[str]:
    """Every module specifier the source loads, in order."""
    toks = tokens(source)
    found: list[str] = []
    for at, tok in enumerate(toks):
        if tok.kind != "word" or tok.text not in ("import", "export"):
            continue
        if at and toks[at - 1] == Token("punct", "."):
            continue  # a property named import
        rest = toks[at + 1 :]
        if tok.text == "import" and rest[:1] == [Token("punct", ".")]:
            continue  # import.meta
        if tok.text == "import" and rest[:1] == [Token("punct", "(")]:
            if len(rest) < 2 or rest[1].kind != "string":
                raise ScanError("a dynamic import of something other than a string literal")
            found.append(rest[1].text)
        elif tok.text == "import" and rest[:1] and rest[0].kind == "string":
            found.append(rest[0].text)
        else:
            spec = _from_clause(rest, tok.text == "export")
            if spec is not None:
                found.append(spec)
    return found


def _from_clause(rest: list[Token], export: bool) -> str | None:
    """The specifier of `import <bindings> from "x"` or `export <names> from "x"`."""
    if export and not (rest[:1] and rest[0] in (Token("punct", "{"), Token("punct", "*"))):
        return None  # export const/function/default: declares, loads nothing
    depth = 0
    for at, tok in enumerate(rest):
        if tok == Token("punct", "{"):
            depth += 1
        elif tok == Token("punct", "}"):
            depth -= 1
        elif depth == 0 and tok == Token("word", "from"):
            nxt = rest[at + 1] if at + 1 < len(rest) else None
            if nxt is None or nxt.kind != "string":
                raise ScanError("`from` without a module specifier")
            return nxt.text
        elif depth == 0 and tok == Token("punct", ";"):
            break
    if export:
        return None  # export { a, b }; of local names
    raise ScanError("an import without `from`")


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One import cycle as the modules along it (the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        path.append(name)
        for dep in graph.get(name, []):
            cycle = visit(dep)
            if cycle:
                return cycle
        path.pop()
        done.add(name)
        return None

    for name in graph:
        cycle = visit(name)
        if cycle:
            return cycle
    return None
