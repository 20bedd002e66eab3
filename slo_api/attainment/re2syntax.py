"""Whether a regular expression is one Prometheus accepts: its dialect is RE2's (Go's
`regexp/syntax` with Perl flags), not Python's `re`. Python takes look-around, backreferences,
atomic groups and possessive quantifiers that RE2 refuses, and refuses `\\pL` or `[[:alpha:]]`
that RE2 takes, so `re.compile` cannot tell; this walks the pattern as Go's parser does.

It refuses a little more than Prometheus: a `)` without its `(` (Prometheus wraps a pattern in
`^(?:...)$`, so `a)|(b` would escape that anchoring) and the rarer Unicode script names.
"""

from __future__ import annotations

# Go's limit on a counted repetition, and on nested ones multiplied together.
MAX_REPEAT = 1000
MAX_DEPTH = 1000
POSIX_CLASSES = frozenset(("alnum", "alpha", "ascii", "blank", "cntrl", "digit", "graph", "lower",
                           "print", "punct", "space", "upper", "word", "xdigit"))  # fmt: skip
UNICODE_CATEGORIES = frozenset(("C", "Cc", "Cf", "Co", "Cs", "L", "Ll", "Lm", "Lo", "Lt", "Lu",
                                "M", "Mc", "Me", "Mn", "N", "Nd", "Nl", "No", "P", "Pc", "Pd",
                                "Pe", "Pf", "Pi", "Po", "Ps", "S", "Sc", "Sk", "Sm", "So", "Z",
                                "Zl", "Zp", "Zs"))  # fmt: skip
# The scripts accepted here (RE2 knows every Unicode script; these are the common ones).
UNICODE_SCRIPTS = frozenset(("Arabic", "Armenian", "Bengali", "Common", "Cyrillic", "Devanagari",
                             "Georgian", "Greek", "Han", "Hangul", "Hebrew", "Hiragana",
                             "Inherited", "Katakana", "Latin", "Tamil", "Thai"))  # fmt: skip
_FLAGS = frozenset("imsU")
_PERL_CLASSES = frozenset("dDsSwW")
_HEX = frozenset("0123456789abcdefABCDEF")
_OCTAL = frozenset("01234567")
_SIMPLE_ESCAPES = frozenset("afnrtv")

# What the last thing parsed leaves for a repetition to apply to.
_NOTHING, _OPEN, _ATOM = 0, 1, 2


class RegexError(ValueError):
    pass


def check(pattern: str) -> None:
    """Raise RegexError saying what RE2 (and so Prometheus) would refuse in `pattern`."""
    try:
        pattern.encode("utf-8")
    except UnicodeEncodeError:
        raise RegexError("it is not valid UTF-8") from None
    _Parser(pattern).parse()


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.s = pattern
        self.i = 0
        self.names: set[str] = set()

    def fail(self, what: str) -> RegexError:
        return RegexError(f"{what} at offset {self.i} (Prometheus uses RE2's syntax)")

    def parse(self) -> None:
        # Per open group: the largest product of counted repetitions on a path inside it so
        # far, and the product of the atom last pushed.
        groups: list[list[int]] = [[1, 1]]
        last, last_repeat = _NOTHING, False
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            repeat = False
            if c == "(":
                if s.startswith("(?", self.i):
                    opened = self._perl_flags()
                    if not opened:
                        last_repeat = False
                        continue
                else:
                    self.i += 1
                if len(groups) > MAX_DEPTH:
                    raise self.fail("the expression nests too deeply")
                groups.append([1, 1])
                last = _OPEN
            elif c == "|":
                self.i += 1
                last = _OPEN
            elif c == ")":
                if len(groups) == 1:
                    raise self.fail("a ')' without its '('")
                inner = groups.pop()[0]
                groups[-1][1] = inner
                groups[-1][0] = max(groups[-1][0], inner)
                self.i += 1
                last = _ATOM
            elif c in "*+?":
                self.i += 1
                self._repeat(last, last_repeat, None, groups)
                repeat = True
            elif c == "{":
                counts = self._counts()
                if counts is None:
                    self.i += 1
                    last = self._atom(groups)
                else:
                    self._repeat(last, last_repeat, counts, groups)
                    repeat = True
            elif c == "[":
                self._class()
                last = self._atom(groups)
            elif c == "\\":
                if self._escape_outside():
                    last = self._atom(groups)
            else:
                self.i += 1
                last = self._atom(groups)
            last_repeat = repeat
        if len(groups) > 1:
            raise self.fail("a '(' without its ')'")

    @staticmethod
    def _atom(groups: list[list[int]]) -> int:
        groups[-1][1] = 1
        return _ATOM

    def _repeat(
        self,
        last: int,
        last_repeat: bool,
        counts: tuple[int, int] | None,
        groups: list[list[int]],
    ) -> None:
        if self.i < len(self.s) and self.s[self.i] == "?":
            self.i += 1  # lazy
        if last_repeat:
            raise self.fail("a repetition of a repetition (such as ** or a possessive ++)")
        if last != _ATOM:
            raise self.fail("a repetition with nothing to repeat")
        if counts is None:
            return
        low, high = counts
        times = high if high >= 0 else low
        group = groups[-1]
        if times == 0:
            group[1] = 1
            return
        product = times * group[1]
        if (low >= 2 or high >= 2) and product > MAX_REPEAT:
            raise self.fail(f"counted repetitions nested beyond {MAX_REPEAT} in all")
        group[1] = product
        group[0] = max(group[0], product)

    def _number(self) -> int | None:
        s, start = self.s, self.i
        while self.i < len(s) and s[self.i].isascii() and s[self.i].isdigit():
            self.i += 1
        digits = s[start : self.i]
        if not digits or (len(digits) >= 2 and digits[0] == "0"):
            return None
        return int(digits) if len(digits) < 8 else -1

    def _counts(self) -> tuple[int, int] | None:
        """`{n}`, `{n,}` or `{n,m}` at `i` (moving past it), or None when it is a literal `{`."""
        start = self.i
        self.i += 1
        low = self._number()
        if low is None:
            self.i = start
            return None
        high = low
        if self.i < len(self.s) and self.s[self.i] == ",":
            self.i += 1
            if self.i < len(self.s) and self.s[self.i] == "}":
                high = -1
            else:
                number = self._number()
                if number is None:
                    self.i = start
                    return None
                high = number
        if self.i >= len(self.s) or self.s[self.i] != "}":
            self.i = start
            return None
        self.i += 1
        if low < 0 or low > MAX_REPEAT or high > MAX_REPEAT or (high >= 0 and low > high):
            raise self.fail(f"a repetition count above {MAX_REPEAT} or out of order")
        return low, high

    def _perl_flags(self) -> bool:
        """`(?P<name>`, `(?flags:` (True: a group opens) or `(?flags)` (False)."""
        s, start = self.s, self.i
        if s.startswith("(?P<", self.i) and len(s) - self.i > 4:
            end = s.find(">", self.i)
            if end < 0:
                raise self.fail("an unterminated group name")
            name = s[self.i + 4 : end]
            if not name or not all(ch.isascii() and (ch.isalnum() or ch == "_") for ch in name):
                raise self.fail(f"a bad group name {name!r}")
            if name in self.names:
                raise self.fail(f"the group name {name!r} twice")
            self.names.add(name)
            self.i = end + 1
            return True
        self.i += 2
        sign, saw_flag = 1, False
        while self.i < len(s):
            ch = s[self.i]
            self.i += 1
            if ch in _FLAGS:
                saw_flag = True
            elif ch == "-" and sign > 0:
                sign, saw_flag = -1, False
            elif ch in ":)":
                if sign < 0 and not saw_flag:
                    break
                return ch == ":"
            else:
                break
        self.i = start
        raise self.fail(
            "a group RE2 lacks (look-around, backreference, atomic group or conditional) "
            "or bad flags"
        )

    def _escape_outside(self) -> bool:
        """An escape outside a class; False when it matches nothing itself (an empty \\Q\\E)."""
        s = self.s
        nxt = s[self.i + 1] if self.i + 1 < len(s) else ""
        if nxt in ("A", "b", "B", "z"):
            self.i += 2
            return True
        if nxt == "C":
            raise self.fail("\\C (any byte)")
        if nxt == "Q":
            end = s.find("\\E", self.i + 2)
            if end < 0:
                # RE2 would take it to the end, and so the `)$` Prometheus closes it with.
                raise self.fail("\\Q without its \\E")
            text = s[self.i + 2 : end]
            self.i = end + 2
            return bool(text)
        if nxt in ("p", "P"):
            self._unicode_class()
            return True
        if nxt and nxt in _PERL_CLASSES:
            self.i += 2
            return True
        self._escape()
        return True

    def _unicode_class(self) -> None:
        s = self.s
        self.i += 2
        if self.i >= len(s):
            raise self.fail("\\p without a class")
        if s[self.i] == "{":
            end = s.find("}", self.i)
            if end < 0:
                raise self.fail("an unterminated \\p{")
            name = s[self.i + 1 : end]
            self.i = end + 1
            name = name.removeprefix("^")
        else:
            name = s[self.i]
            self.i += 1
        if name != "Any" and name not in UNICODE_CATEGORIES and name not in UNICODE_SCRIPTS:
            raise self.fail(f"the Unicode class {name!r} (not known here)")

    def _escape(self) -> None:
        """One escaped character: `\\x41`, `\\x{263a}`, `\\012`, `\\n`, `\\.`."""
        s = self.s
        self.i += 1
        if self.i >= len(s):
            raise self.fail("a trailing backslash")
        c = s[self.i]
        self.i += 1
        if c < "\x80" and not c.isalnum():
            return
        if (c in "1234567" and self.i < len(s) and s[self.i] in _OCTAL) or c == "0":
            for _ in range(2):
                if self.i < len(s) and s[self.i] in _OCTAL:
                    self.i += 1
            return
        if c == "x":
            if s.startswith("{", self.i):
                end = s.find("}", self.i)
                digits = s[self.i + 1 : end] if end >= 0 else ""
                if digits and all(d in _HEX for d in digits) and int(digits, 16) <= 0x10FFFF:
                    self.i = end + 1
                    return
            elif len(s) - self.i >= 2 and s[self.i] in _HEX and s[self.i + 1] in _HEX:
                self.i += 2
                return
            raise self.fail("a bad \\x escape")
        if c in _SIMPLE_ESCAPES:
            return
        self.i -= 2
        raise self.fail(f"the escape \\{c} (backreferences and most letters are not RE2's)")

    def _class(self) -> None:
        s = self.s
        self.i += 1
        if self.i < len(s) and s[self.i] == "^":
            self.i += 1
        first = True
        while True:
            if self.i >= len(s):
                raise self.fail("a '[' without its ']'")
            if s[self.i] == "]" and not first:
                self.i += 1
                return
            first = False
            if s.startswith("[:", self.i):
                end = s.find(":]", self.i + 2)
                if end >= 0:
                    name = s[self.i + 2 : end].removeprefix("^")
                    if name not in POSIX_CLASSES:
                        raise self.fail(f"the class [:{name}:]")
                    self.i = end + 2
                    continue
            if s[self.i] == "\\" and self.i + 1 < len(s):
                nxt = s[self.i + 1]
                if nxt in ("p", "P"):
                    self._unicode_class()
                    continue
                if nxt in _PERL_CLASSES:
                    self.i += 2
                    continue
            low = self._class_char()
            if self.i + 1 < len(s) and s[self.i] == "-" and s[self.i + 1] != "]":
                self.i += 1
                high = self._class_char()
                if high < low:
                    raise self.fail("a range out of order in a class")

    def _class_char(self) -> int:
        """One character of a class, as its code point."""
        s = self.s
        if self.i >= len(s):
            raise self.fail("a '[' without its ']'")
        if s[self.i] != "\\":
            self.i += 1
            return ord(s[self.i - 1])
        start = self.i
        self._escape()
        text = s[start + 1 : self.i]
        if text[0] == "x":
            return int(text[1:].strip("{}"), 16)
        if text[0] in _OCTAL:
            return int(text, 8)
        simple = {"a": 7, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}
        return simple.get(text, ord(text))
