"""Stream framing read back as clients read it: line by line, with Python's own line rules."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from slo_api.feed import framing

# Text that leans on the characters a line reader may split at, among any others that JSON
# in UTF-8 can carry (a lone surrogate cannot be encoded at all).
TEXT = st.text(
    st.one_of(
        st.sampled_from('\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"\\'),
        st.characters(codec="utf-8"),
    ),
)


@given(key=TEXT, value=TEXT)
def test_every_event_is_one_line_and_reads_back_whole(key: str, value: str) -> None:
    item = json.dumps({key: value}, ensure_ascii=False).encode()
    line = framing.change_line("MODIFIED", value, item, b"7")
    ndjson = framing.frame(line, b"7", sse=False).decode()
    [read] = ndjson.splitlines()
    assert json.loads(read) == {
        "type": "MODIFIED",
        "route": value,
        "object": {key: value},
        "revision": "7",
    }
    sse = framing.frame(line, b"7", sse=True).decode()
    assert sse.splitlines() == ["id: 7", "data: " + read, ""]
