"""What can go wrong talking to the site, as one message and one exit code each, so a
script can tell "fix your input" from "log in again" from "the site is down" without
reading the text.

    0  done (follow: the run succeeded)
    1  follow: the run failed (or was lost); cancel: some runs were refused
    2  the site refused the request's content (400: each field and its message), or
       the command line itself was wrong (click's usage errors are 2 as well)
    3  follow: the run was cancelled
    4  not allowed: no token, unknown or revoked token (401) or a role too low (403)
    5  not found (404): no such run, or not one of the token's team
    6  conflict (409): the run is in a state that does not allow it (export before the
       run finished, cancel after it ended)
    7  the site could not be reached or did not answer as a Rollway site (connection
       refused, timeout, 5xx, a page that is not JSON)
"""

from __future__ import annotations

OK = 0
RUN_FAILED = 1
PARTLY_REFUSED = 1
BAD_REQUEST = 2
RUN_CANCELLED = 3
NOT_ALLOWED = 4
NOT_FOUND = 5
CONFLICT = 6
UNREACHABLE = 7

BY_HTTP_STATUS = {400: BAD_REQUEST, 401: NOT_ALLOWED, 403: NOT_ALLOWED, 404: NOT_FOUND, 409: CONFLICT}


class CliError(Exception):
    """A failure to report as `message` (no traceback) and leave with `exit_code`."""

    def __init__(self, message: str, exit_code: int, *, errors: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.errors = errors or {}


class ApiError(CliError):
    """The site answered with an error status; `errors` is its {field: message} body."""

    def __init__(self, status: int, message: str, errors: dict[str, str] | None = None):
        super().__init__(
            message, BY_HTTP_STATUS.get(status, UNREACHABLE if status >= 500 else BAD_REQUEST), errors=errors
        )
        self.status = status
