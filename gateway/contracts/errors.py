"""Errors shared across Herald. Each class says what the caller should do next."""

from __future__ import annotations


class HeraldError(Exception):
    """Base of every error Herald raises on purpose."""


class TransientError(HeraldError):
    """Try again later; nothing is wrong with the request itself."""


class NotReady(TransientError):
    """The connection is not usable yet (network down, server 5xx). Retry with backoff."""


class RateLimited(TransientError):
    """The remote side asked us to slow down. Retry this target after `retry_after` seconds."""

    def __init__(self, retry_after: float, message: str = "") -> None:
        self.retry_after = max(0.0, float(retry_after))
        super().__init__(message or f"rate limited; retry after {self.retry_after:.1f}s")


class AuthError(HeraldError):
    """Credentials were refused. Stop and re-authenticate; retrying will not help."""


class PermanentSendError(HeraldError):
    """This message can never be delivered as it is (bad chat, blocked). Dead-letter it."""


class MarkupRejected(PermanentSendError):
    """The platform refused the message's markup. Send it again as plain text."""


class ConfigError(HeraldError):
    """The configuration is invalid. Fix the named key and start again."""


class ShuttingDown(TransientError):
    """The daemon is draining and accepts no new work. Retry against another instance or later."""


class Overloaded(TransientError):
    """Too many turns are waiting already; this one was refused. Retry after `retry_after` s."""

    def __init__(self, retry_after: float, message: str = "") -> None:
        self.retry_after = max(0.0, float(retry_after))
        super().__init__(message or f"overloaded; retry after {self.retry_after:.0f}s")


class LLMError(HeraldError):
    """The language model could not answer."""


class LLMUnavailable(LLMError, TransientError):
    """The model endpoint is unreachable, overloaded or timed out. Retry later."""


class LLMRejected(LLMError):
    """The model endpoint refused the request (bad key, unknown model, bad request). Fix config."""


class SessionNotFound(HeraldError, LookupError):
    """No session has that key."""


class LeaseLost(HeraldError):
    """Another instance holds this lease or session now. Stop acting on it: whatever this
    instance was about to write is discarded, and the new holder does the work."""


class InstanceConflict(ConfigError):
    """Another live instance already runs with this id, or on this SQLite database. Stop it,
    or give this one its own `instance_id` (several instances need PostgreSQL)."""


class SetupError(ConfigError):
    """The machine is not as the configuration expects: a state directory Herald cannot
    write, a port in use, a database that is missing or newer than this code. Fix what the
    message names and start again; restarting alone will not help."""


class DatabaseUnavailable(TransientError):
    """The database server does not answer (down, starting, unreachable). Start it or fix
    `database_url`; a later try may succeed."""


class FileStoreUnavailable(TransientError):
    """The blob store (the database or the S3 bucket) failed: unreachable, credentials
    refused, no such bucket. The message says which; try again later or fix `files.*`."""


class FileGone(HeraldError, LookupError):
    """No bytes are kept under this key (pruned after `files.retention_days`, or never
    stored). Ask for the file again."""


class FileTooLarge(HeraldError, ValueError):
    """A file is larger than `files.max_file_bytes`; it is not kept."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"the file is {size} bytes; files of at most {limit} bytes are kept")
