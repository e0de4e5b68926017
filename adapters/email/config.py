"""The `platforms.email` config section."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.contracts.config import PlatformSection
from gateway.contracts.messages import InboundMessage

REFUSED = "refused"
"""Key of `InboundMessage.raw` where the adapter says why a mail must not reach the agent."""


class Security(StrEnum):
    """How a connection to a mail server is protected."""

    TLS = "tls"
    """TLS from the first byte (IMAPS 993, SMTPS 465)."""
    STARTTLS = "starttls"
    """Plain connection upgraded with STARTTLS (IMAP 143, submission 587)."""
    NONE = "none"
    """No encryption: only for a server on the same machine or a test."""


class SessionBy(StrEnum):
    """What one session with the agent is."""

    THREAD = "thread"
    """One session per mail thread (References / In-Reply-To)."""
    SENDER = "sender"
    """One session per correspondent, whatever the thread."""


class AfterReceipt(StrEnum):
    """What happens to a mail on the server once it is in Herald's inbox."""

    SEEN = "seen"
    """Flag it `\\Seen` and leave it in the folder."""
    MOVE = "move"
    """Move it to `move_to`."""


class EmailConfig(PlatformSection):
    """A mailbox: where to read mail (IMAP), how to send it (SMTP), and who may write."""

    imap_host: str = Field(min_length=1)
    imap_port: int = Field(default=993, ge=1, le=65535)
    imap_security: Security = Security.TLS
    smtp_host: str = Field(min_length=1)
    smtp_port: int = Field(default=465, ge=1, le=65535)
    smtp_security: Security = Security.TLS
    username: str = Field(min_length=1)
    """The login for both servers."""
    password: SecretStr
    """`HERALD_PLATFORMS__EMAIL__PASSWORD` or `password_file`."""
    address: str = Field(pattern=r"^[^@\s<>]+@[^@\s<>]+$")
    """Herald's own address: the From of every reply."""
    display_name: str = "Herald"
    folder: str = Field(default="INBOX", min_length=1)
    """The folder watched for new mail."""
    allowed_senders: tuple[str, ...] = ()
    """Addresses (`ann@example.com`) and domains (`@example.com`) whose mail is answered."""
    pairing: bool = False
    """Unknown senders are ignored; on, they are sent a pairing code like on chat platforms."""
    session_by: SessionBy = SessionBy.THREAD
    require_authentication_results: bool = False
    """Only accept mail whose `Authentication-Results` from the receiving server (see
    `authserv_id`) say `dkim=pass` or `spf=pass` for the sender's domain."""
    authserv_id: str | None = Field(default=None, min_length=1, pattern=r"^[^\s;()\"]+$")
    """The authserv-id the receiving mail server writes first in its `Authentication-Results`
    (e.g. `mx.example.com`); results under any other id are the sender's own words."""
    received_above_results: int = Field(default=0, ge=0, le=10)
    """How many `Received` headers the operator's own delivery adds above the receiving
    server's `Authentication-Results`: 0 as RFC 8601 asks (the results sit above every trace
    header), 1 for a delivery agent that adds its own (Dovecot's LMTP does)."""
    after_receipt: AfterReceipt = AfterReceipt.SEEN
    move_to: str = Field(default="Herald", min_length=1)
    """The folder mail is moved to when `after_receipt` is `move` (it must exist)."""
    poll_interval: float = Field(default=60.0, gt=0, le=3600)
    """Seconds between two checks for new mail when the server has no IDLE."""
    idle_renew: float = Field(default=1500.0, gt=0, le=1740)
    """Seconds after which IDLE is re-issued (servers may drop it after 30 minutes)."""
    timeout: float = Field(default=30.0, gt=0, le=300)
    """Seconds one IMAP or SMTP command may take."""
    attachment_max_bytes: int = Field(default=20 * 1024 * 1024, ge=0)
    """Larger attachments are not kept (the agent is told about them)."""
    message_max_bytes: int = Field(default=50 * 1024 * 1024, gt=0)
    """Larger mails are read by their headers only."""
    header_max_bytes: int = Field(default=128 * 1024, ge=1024, le=16 * 1024 * 1024)
    """A mail whose header block is larger is refused unread."""
    max_parts: int = Field(default=100, ge=1, le=100_000)
    """A mail of more MIME parts is refused unread."""
    max_depth: int = Field(default=10, ge=1, le=100)
    """A mail whose MIME parts nest deeper is refused."""
    max_line_bytes: int = Field(default=100_000, ge=1000)
    """A mail with a longer line is refused unread."""
    parse_timeout: float = Field(default=10.0, gt=0, le=300)
    """Seconds reading one mail may take (in a worker thread); a slower one is refused."""
    tls_verify: bool = True
    """Check the servers' certificates (turn off only for a self-signed test server)."""

    @field_validator("allowed_senders", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @field_validator("allowed_senders", "allowed_users")
    @classmethod
    def _lowercase(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(v.strip().lower() for v in value if v.strip())

    @field_validator("address")
    @classmethod
    def _lower_address(cls, value: str) -> str:
        return value.lower()

    @model_validator(mode="after")
    def _move_needs_a_folder(self) -> EmailConfig:
        if self.after_receipt is AfterReceipt.MOVE and self.move_to == self.folder:
            raise ValueError("move_to must differ from folder")
        if self.require_authentication_results and not self.authserv_id:
            raise ValueError(
                "require_authentication_results needs authserv_id: the name your receiving mail "
                "server writes first in its Authentication-Results headers (e.g. mx.example.com); "
                "results under any other name could be written by the sender"
            )
        return self

    @field_validator("authserv_id")
    @classmethod
    def _lower_authserv_id(cls, value: str | None) -> str | None:
        return value.lower() if value else value

    @property
    def singleton(self) -> bool:
        """One IMAP IDLE connection per mailbox across instances."""
        return True

    @property
    def identity(self) -> tuple[str, str] | None:
        """The watched folder of one mailbox: two accounts reading it would take (and
        answer) every mail twice."""
        where = f"{self.imap_host.lower()}:{self.imap_port}/{self.username}/{self.folder}"
        return "username", where

    @property
    def verified_senders(self) -> bool:
        """A mail's `From` is vouched for only by the receiving server's authentication
        results (`require_authentication_results`); otherwise anyone can write it."""
        return self.require_authentication_results

    def admits(self, message: InboundMessage) -> bool:
        """Whether the mail's sender is allowed (see `admits_address`)."""
        return self.admits_address(str(message.sender.id))

    def admits_address(self, sender: str) -> bool:
        """Whether `sender` (an address) is allowed: listed, or its domain is (`@domain`)."""
        address = sender.lower()
        if address in self.allowed_senders or address in self.allowed_users:
            return True
        _, _, domain = address.rpartition("@")
        return bool(domain) and f"@{domain}" in self.allowed_senders

    def refusal(self, message: InboundMessage) -> str | None:
        """Why the adapter refused this mail (automatic, bounce, own, unauthenticated), or None."""
        reason = message.raw.get(REFUSED)
        return reason if isinstance(reason, str) and reason else None
