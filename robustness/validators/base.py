"""What every validator returns: violations, each saying which promise, where, and what
happened around it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from robustness.model import Ground, State
from robustness.recording import Recording, Request


@dataclass(slots=True)
class Violation:
    validator: str
    promise: str
    message: str
    route: str | None = None
    # The events around it, oldest first, one line each.
    context: list[str] = field(default_factory=list)

    def render(self) -> str:
        where = f" [route {self.route}]" if self.route else ""
        lines = [f"{self.validator}{where}: {self.message}", f"  promise: {self.promise}"]
        lines += [f"    {line}" for line in self.context]
        return "\n".join(lines)


Validator = Callable[[Recording, Ground], list[Violation]]


def describe_request(r: Request) -> str:
    answer = f"{r.status}" if r.status is not None else f"no answer ({r.error})"
    extra = []
    for name in ("If-Match", "X-Request-Id"):
        value = r.sent_header(name)
        if value:
            extra.append(f"{name}: {value}")
    etag = r.header("ETag")
    if etag:
        extra.append(f"ETag {etag}")
    tail = f" ({', '.join(extra)})" if extra else ""
    return (
        f"t={r.sent:.3f} {r.replica} {r.identity} {r.method} {r.path} -> {answer}{tail}"
        f" body {_short(r.request_body)}"
    )


def describe_state(s: State) -> str:
    what = "DELETED" if s.deleted else _short(s.owned)
    by = ",".join(sorted({str(m.get("manager")) for m in s.managers}))
    gap = " (after a gap in the harness's watch)" if s.after_gap else ""
    return f"t={s.time:.3f} truth {s.where()}: {what} managers[{by}]{gap}"


def _short(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def around(ground: Ground, state: State, before: int = 2, after: int = 1) -> list[str]:
    """The truth states of one CR around one of them."""
    history = ground.states[state.uid]
    at = state.at
    return [describe_state(s) for s in history[max(0, at - before) : at + after + 1]]


def context(lines: Iterable[str]) -> list[str]:
    return list(lines)
