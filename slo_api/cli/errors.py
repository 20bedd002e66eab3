"""Exit codes and the one exception type the commands raise."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    SERVER = 1
    USAGE = 2
    NOT_FOUND = 3
    CONFLICT = 4
    AUTH = 5


EXIT_CODES_HELP = """\
exit codes:
  0  success
  1  server trouble: 5xx answer, timeout, connection failure, unreadable answer
  2  usage error: bad arguments, bad key=value, bad file, or 400 from the API
  3  not found (404)
  4  conflict: route claimed by several CRs (409), or still stale after retries (412)
  5  unauthorized or forbidden (401/403)"""


class CliError(Exception):
    """An error the user can act on: printed as one message, never as a traceback."""

    def __init__(
        self,
        message: str,
        exit_code: ExitCode,
        *,
        status: int | None = None,
        field: str | None = None,
        details: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.status = status
        self.field = field
        # Extra lines shown under the message: the API's causes, or a hint.
        self.details = details


def usage(message: str) -> CliError:
    return CliError(message, ExitCode.USAGE)
