"""README.md and docs/*.md: every relative link and #anchor resolves, every doc is reachable."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.markdown import anchors, broken_links, links, slug

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda d: d.name)
def test_every_relative_link_and_anchor_resolves(doc: Path) -> None:
    assert broken_links(doc) == []


def test_every_doc_is_linked_from_the_readme() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README.read_text())}
    assert [d.name for d in DOCS if d.resolve() not in linked] == []


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Following changes: `GET /config?watch=true`", "following-changes-get-configwatchtrue"),
        ("History: who changed a route, and undo", "history-who-changed-a-route-and-undo"),
        ("The informers: backoff, recovery", "the-informers-backoff-recovery"),
        ("Shutdown (SIGTERM)", "shutdown-sigterm"),
        ("**Bold** and _emphasis_ in WATCH_NAMESPACES", "bold-and-emphasis-in-watch_namespaces"),
        ("[A link](x.md) here", "a-link-here"),
    ],
)
def test_anchors_follow_githubs_slug_rules(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_repeated_heading_gets_a_numbered_anchor() -> None:
    assert anchors("# Setup\n\n## Setup\n\n```\n# not a heading\n```\n### Setup\n") == {
        "setup",
        "setup-1",
        "setup-2",
    }


def test_broken_links_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# There\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Here\n\n[ok](#here) [ok](other.md#there) [ok](https://example.com/x#y)\n"
        "[gone](missing.md) [no anchor](#nowhere) [no anchor](other.md#here)\n"
        "`[in code](missing.md)`\n\n```\n[in a block](missing.md)\n```\n"
    )
    assert broken_links(doc) == [
        "doc.md: missing.md: no file missing.md",
        "doc.md: #nowhere: doc.md has no heading #nowhere",
        "doc.md: other.md#here: other.md has no heading #here",
    ]
