"""Enough Markdown for the docs tests: headings, the anchors GitHub gives them, relative links.

The anchors follow GitHub's slug rules (github-slugger): the heading's text without its markup,
lower-cased, every character that is not a letter, digit, `_`, `-` or space dropped, spaces
turned into `-`; a repeated slug gets `-1`, `-2`, ... in order.
"""

from __future__ import annotations

import re
from pathlib import Path

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_ABSOLUTE = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _outside_fences(text: str) -> list[str]:
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def headings(text: str) -> list[str]:
    """The text of every ATX heading outside code blocks, in order."""
    found: list[str] = []
    for line in _outside_fences(text):
        match = _HEADING.match(line)
        if match:
            found.append(match.group(2))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for one heading, before de-duplication."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = re.sub(r"\*{1,3}([^*]+)\*{1,3}", r"\1", text)  # emphasis
    text = re.sub(r"(?<!\w)_{1,3}([^_]+)_{1,3}(?!\w)", r"\1", text)  # not inside a word
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every `#fragment` a link may use into this document."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for heading in headings(text):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[str]:
    """The target of every inline link and image outside code, in order."""
    found: list[str] = []
    for line in _outside_fences(text):
        found.extend(m.group(1) for m in _LINK.finditer(_CODE_SPAN.sub("code", line)))
    return found


def broken_links(doc: Path) -> list[str]:
    """Each relative link of `doc` whose file or `#anchor` does not exist, as a message."""
    problems: list[str] = []
    for target in links(doc.read_text()):
        if _ABSOLUTE.match(target):
            continue
        path, _, fragment = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            problems.append(f"{doc.name}: {target}: no file {path}")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file.read_text()):
            problems.append(f"{doc.name}: {target}: {file.name} has no heading #{fragment}")
    return problems
