"""JSON kept packed: deflated against a preset dictionary learned per kind.

Every replica holds every CR, and CRs of one kind are mostly the same bytes (keys, the API
group, the shape of spec and status): deflated against one typical CR of its kind, a CR's
JSON of ~1 KiB keeps ~80 bytes; without a dictionary ~500. Unpacking costs less than decoding
the JSON that comes out (a few microseconds), packing about what encoding it did.

The dictionary of a kind is learned from the first object of it packed (and taught once more:
see POOR), held once and shared by every object packed with it: each keeps a reference to its
own, so it can always be unpacked, whatever was learned since or elsewhere.
"""

from __future__ import annotations

import zlib

# The dictionary: the last this many bytes of the first object of a kind. Deflate reaches back
# at most a window (_WBITS) for a match, and prefers the dictionary's end (nearer, so shorter
# codes); every pack primes the compressor with the whole dictionary first, at a cost that
# grows with it; and a huge first object must not be held whole as a kind's dictionary. 4 KiB
# holds a typical CR (about 1 KiB) several times over and still leaves the window room for one.
DICTIONARY_BYTES = 4096
# An object of a kind that packs to more than 1/POOR of its JSON is taught to the kind's
# dictionary (appended, the dictionary kept to its last DICTIONARY_BYTES), once per kind: the
# first object is often a CR just created, without the status every later one carries (those
# then kept ~200 bytes, not ~80). Only an object of at most LESSON_BYTES teaches: the first
# object's last LESSON_BYTES stay in the dictionary whatever it is taught, so the lesson never
# makes it worse for objects like the first.
POOR = 8
LESSON_BYTES = DICTIONARY_BYTES // 2
# A raw deflate stream: no zlib header nor checksum, ten bytes an object that nothing needs
# (the bytes never leave the process). An 8 KiB window: the dictionary and an object of its
# size both in reach.
_WBITS = -13
# zlib's default level; a smaller memory level than its default (8): a CR is small, and the
# compressor set up for every pack costs less to make (a pack took ~30% less, as small).
_LEVEL = 6
_MEM_LEVEL = 5


def pack(data: bytes, dictionary: bytes) -> bytes:
    """`data` deflated against `dictionary`."""
    packer = zlib.compressobj(
        _LEVEL, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, dictionary
    )
    return packer.compress(data) + packer.flush()


def unpack(data: bytes, dictionary: bytes) -> bytes:
    """The bytes `pack(…, dictionary)` made `data` of."""
    unpacker = zlib.decompressobj(_WBITS, zdict=dictionary)
    out = unpacker.decompress(data) + unpacker.flush()
    if not unpacker.eof:
        raise ValueError("packed JSON cut short")
    return out


def _tail(data: bytes) -> bytes:
    """The last DICTIONARY_BYTES of `data`, a copy of its own: never `data` itself, which may
    hold more than its bytes (an encoder's buffer behind it)."""
    return bytes(memoryview(data)[-DICTIONARY_BYTES:])


class Dictionaries:
    """The dictionary of each kind (plural), learned from the first object of it packed (and
    one lesson: see POOR)."""

    def __init__(self) -> None:
        self._of: dict[str, bytes] = {}
        self._taught: set[str] = set()

    def packed(self, kind: str, data: bytes) -> tuple[bytes, bytes | None]:
        """`data` packed, and the dictionary it was packed with; or, where packing would not
        make it smaller (an object unlike its kind's first), `data` as it is and None."""
        dictionary = self._of.get(kind)
        if dictionary is None:
            dictionary = self._of[kind] = _tail(data)
        out = pack(data, dictionary)
        if len(out) * POOR > len(data) and len(data) <= LESSON_BYTES and kind not in self._taught:
            self._taught.add(kind)
            dictionary = self._of[kind] = _tail(dictionary + data)
            out = pack(data, dictionary)
        return (out, dictionary) if len(out) < len(data) else (data, None)

    def forget(self, kind: str) -> None:
        """The kind holds nothing any more: its next object teaches it anew. What was packed
        with the old dictionary keeps it, and unpacks as before."""
        self._of.pop(kind, None)
        self._taught.discard(kind)

    def held_bytes(self) -> int:
        """What the dictionaries themselves hold (each once, whatever shares it)."""
        return sum(len(d) for d in self._of.values())
