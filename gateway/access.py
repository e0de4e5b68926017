"""Who may talk to the agent: allowlists from config, grants from approved pairing codes.

Deny by default on messaging platforms. An unknown sender in a direct chat gets a pairing
code (8 characters, valid for `access.pairing_ttl`, at most `access.max_pending_pairings`
pending per platform) that the operator approves with `herald pairing approve CODE`. Unknown
senders in groups are ignored. Platforms without a config section (api, cli, cron) are not
subject to these rules: they have their own authentication.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import StrEnum

from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.config import AccessConfig
from gateway.contracts.config import PlatformSection
from gateway.contracts.ids import AccountId, ChatId, UserId
from gateway.contracts.messages import InboundMessage, utcnow
from gateway.store import Store
from gateway.store import pairings as pairings_sql
from gateway.store.outbox import Chunk, Outbox, Target
from gateway.store.pairings import Pairing, grant

logger = logging.getLogger(__name__)

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
"""No 0/O or 1/I: codes are read aloud and typed by hand."""
CODE_LENGTH = 8
APPROVED_NOTICE = "✅ You now have access. Send your message again."
"""What the sender of an approved pairing code is told."""


class Verdict(StrEnum):
    """What to do with a message from this sender."""

    ALLOW = "allow"
    PAIR = "pair"
    """Unknown sender in a direct chat: reject, answer with a pairing code (or why not)."""
    IGNORE = "ignore"
    """Reject silently (unknown sender in a group, or a pairing reply sent too recently)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """A verdict, and the reply to send when there is one."""

    verdict: Verdict
    reply: str | None = None
    detail: str = ""


def new_code() -> str:
    """A fresh random pairing code."""
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


class Access:
    """Decides per inbound message; pairing rows are written in the caller's transaction."""

    def __init__(
        self,
        store: Store,
        sections: Mapping[tuple[str, str], PlatformSection],
        config: AccessConfig,
    ) -> None:
        self.store = store
        self.sections = dict(sections)
        self.config = config
        self._replied: dict[tuple[str, str], float] = {}
        self._told_full: dict[str, list[float]] = {}
        """Per `platform:account`, when strangers were last told that too many codes are
        pending."""

    def is_operator(self, platform: str, external_id: str, account: str | None = None) -> bool:
        """Whether this sender operates Herald: listed in `access.operators` (as
        `platform:id`, any account of the platform, or as `platform:account:id` when the
        account is known), on an account that vouches for its senders' ids (a mail's `From`
        is only a claim unless its authentication results are required)."""
        named = [s for (p, a), s in self.sections.items() if p == platform and account in (None, a)]
        if any(not section.verified_senders for section in named):
            return False
        operators = self.config.operators
        if f"{platform}:{external_id}" in operators:
            return True
        return account is not None and f"{platform}:{account}:{external_id}" in operators

    async def is_operator_user(self, user_id: UserId | None) -> bool:
        """Whether this Herald user operates it: the local owner (the CLI and the API key
        holder), or a person one of whose identities is listed in `access.operators`."""
        if user_id is None:
            return False
        identities = await self.store.identities_of(user_id)
        return any(
            (platform, external) == ("local", "owner") or self.is_operator(platform, external)
            for platform, external in identities
        )

    async def job_operator(self, user_id: UserId | None, created_by: str) -> bool:
        """Whether a scheduled job's run has operator rights, from the current config: a job
        made in a chat (`created_by` is that person's `platform:id`, a known identity) has
        the rights of that identity alone, never of a user it was linked to then or now;
        any other job (CLI, API) those of its owner (`is_operator_user`)."""
        platform, sep, external = created_by.partition(":")
        if sep and external and await self.store.user_of(platform, external) is not None:
            return self.is_operator(platform, external)
        return await self.is_operator_user(user_id)

    def governed(self, platform: str) -> bool:
        """Whether the platform's senders are subject to allowlists."""
        return any(p == platform for p, _ in self.sections)

    async def permits(self, message: InboundMessage) -> bool:
        """Whether `decide` would allow `message` now; reads only (no pairing row, no reply
        throttling). Adapters ask before downloading a message's files."""
        static = self._by_rules(message)
        if static is not None:
            return static.verdict is Verdict.ALLOW
        async with self.store.read() as conn:
            return await self._granted(conn, message)

    async def decide(self, conn: AsyncConnection, message: InboundMessage) -> Decision:
        """Allow, or reject with a pairing reply, or ignore. May insert a pairing row."""
        static = self._by_rules(message)
        if static is not None:
            return static
        platform = str(message.platform)
        section = self.sections[(platform, str(message.account))]
        sender = str(message.sender.id)
        if await self._granted(conn, message):
            return Decision(Verdict.ALLOW)
        if not message.is_direct or not section.pairing:
            return Decision(Verdict.IGNORE, detail="sender not allowed")
        if not self._may_reply(f"{platform}:{message.account}", sender):
            return Decision(
                Verdict.IGNORE, detail="sender not allowed; pairing reply sent recently"
            )
        # Check-then-insert below must not interleave with another stranger's.
        await pairings_sql.lock_pairings(conn, platform)
        now = utcnow()
        await pairings_sql.expire_pairings(conn, now)
        existing = await pairings_sql.pending_code(conn, platform, sender, str(message.account))
        if existing is not None:
            return Decision(
                Verdict.PAIR, self._pair_text(existing), "sender not allowed; code resent"
            )
        # Per account: strangers flooding one bot never shut pairing on another.
        waiting = await pairings_sql.count_pending(conn, platform, str(message.account))
        if waiting >= self.config.max_pending_pairings:
            # A flood of strangers: no reply each.
            if not self._may_tell_full(f"{platform}:{message.account}"):
                return Decision(
                    Verdict.IGNORE,
                    detail="sender not allowed; too many pending pairing codes (not told)",
                )
            return Decision(
                Verdict.PAIR,
                "This assistant is private, and too many access requests are waiting for the "
                "operator right now. Please try again later.",
                "sender not allowed; too many pending pairing codes",
            )
        for _ in range(5):
            code = new_code()
            created = await pairings_sql.insert_pairing(
                conn,
                {
                    "code": code,
                    "platform": platform,
                    "account": message.account,
                    "external_id": sender,
                    "chat_id": message.chat_id,
                    "display_name": message.sender.display_name[:256],
                    "status": "pending",
                    "created_at": now,
                    "expires_at": now + timedelta(seconds=self.config.pairing_ttl),
                },
            )
            if created:
                logger.info(
                    "%s sender %s asked to pair (account %s): code %s, expires %s UTC; "
                    "approve with `herald pairing approve %s`",
                    platform,
                    sender,
                    message.account,
                    code,
                    f"{now + timedelta(seconds=self.config.pairing_ttl):%Y-%m-%d %H:%M}",
                    code,
                )
                return Decision(
                    Verdict.PAIR, self._pair_text(code), "sender not allowed; code sent"
                )
        raise RuntimeError("could not draw a unique pairing code")

    def _by_rules(self, message: InboundMessage) -> Decision | None:
        """The decision config alone makes (no section, refusal, allowlist, bot), or None
        when it depends on the grants in the database."""
        section = self.sections.get((str(message.platform), str(message.account)))
        if section is None:
            if self.governed(str(message.platform)):  # an account not configured (now)
                return Decision(Verdict.IGNORE, detail=f"account {message.account} not set up")
            return Decision(Verdict.ALLOW)
        refusal = section.refusal(message)
        if refusal is not None:
            return Decision(Verdict.IGNORE, detail=refusal)
        if section.admits(message):
            return Decision(Verdict.ALLOW)
        if message.sender.is_bot:  # `*` means any person: two bots must not talk forever
            return Decision(Verdict.IGNORE, detail="messages from bots are ignored")
        if "*" in section.allowed_users:
            return Decision(Verdict.ALLOW)
        return None

    @staticmethod
    async def _granted(conn: AsyncConnection, message: InboundMessage) -> bool:
        return await pairings_sql.is_granted(
            conn, str(message.platform), str(message.sender.id), str(message.account)
        )

    def _pair_text(self, code: str) -> str:
        minutes = max(1, round(self.config.pairing_ttl / 60))
        valid = "one hour" if minutes == 60 else f"{minutes} minutes"
        return (
            f"This assistant is private. Your pairing code is {code} (valid for {valid}). "
            f"Ask its operator to run: herald pairing approve {code}"
        )

    def _may_tell_full(self, account: str) -> bool:
        """Whether one more stranger may be told to try later: at most
        `max_pending_pairings` such replies per account per `pairing_reply_interval`, so a
        flood of strangers gets a bounded number of replies. Records it."""
        now = time.monotonic()
        interval = self.config.pairing_reply_interval
        told = [t for t in self._told_full.get(account, []) if now - t < interval]
        if len(told) >= self.config.max_pending_pairings:
            self._told_full[account] = told
            return False
        self._told_full[account] = [*told, now]
        return True

    def _may_reply(self, platform: str, sender: str) -> bool:
        now = time.monotonic()
        interval = self.config.pairing_reply_interval
        if len(self._replied) > 10_000:  # bound the memory a flood of strangers can take
            self._replied = {k: t for k, t in self._replied.items() if now - t < interval}
        last = self._replied.get((platform, sender))
        if last is not None and now - last < interval:
            return False
        self._replied[(platform, sender)] = now
        return True


class Pairings:
    """The operator's side: list, approve, reject and revoke (`herald pairing …`, the console)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def list(self, *, all_: bool = False) -> list[Pairing]:
        """Pending, unexpired requests (every request with `all_`), newest first."""
        async with self.store.read() as conn:
            return await pairings_sql.list_pairings(conn, all_=all_)

    async def approve(self, code: str) -> Pairing:
        """Grant the code's sender access. Raises LookupError (unknown or expired code)."""
        code = code.strip().upper()
        now = utcnow()
        async with self.store.write() as conn:
            row = await pairings_sql.pairing_by_code(conn, code)
            if row is None or row.status != "pending":
                raise LookupError(f"no pending pairing code {code!r}")
            expired = row.expires_at <= now
            if expired:
                await pairings_sql.decide_pairing(conn, row.id, "expired", now)
        if expired:
            raise LookupError(f"pairing code {code} has expired; ask for a new one")
        async with self.store.write() as conn:
            await pairings_sql.decide_pairing(conn, row.id, "approved", now)
            await grant(conn, row.platform, row.external_id, via=f"pairing {code}")
        approved = [p for p in await self.list(all_=True) if p.code == code]
        return approved[0]

    async def approve_and_tell(self, code: str) -> Pairing:
        """Approve the code (as `approve`) and queue a message telling its sender they now
        have access. Raises LookupError (unknown or expired code)."""
        pairing = await self.approve(code)
        await Outbox(self.store).enqueue(
            [
                Chunk(
                    f"paired:{pairing.id}",
                    Target(pairing.platform, AccountId(pairing.account), ChatId(pairing.chat_id)),
                    APPROVED_NOTICE,
                )
            ]
        )
        return pairing

    async def reject(self, code: str) -> Pairing:
        """Refuse a pending code: its sender gets no access (and may ask again later).
        Raises LookupError when no pending code has that name."""
        code = code.strip().upper()
        async with self.store.write() as conn:
            row = await pairings_sql.pairing_by_code(conn, code)
            if row is None or row.status != "pending":
                raise LookupError(f"no pending pairing code {code!r}")
            await pairings_sql.decide_pairing(conn, row.id, "rejected", utcnow())
        return replace(row, status="rejected")

    async def revoke(self, who: str) -> int:
        """Withdraw access by code or `platform:user id`; how many grants/codes were revoked."""
        now = utcnow()
        changed = 0
        async with self.store.write() as conn:
            code = who.strip().upper()
            row = await pairings_sql.pairing_by_code(conn, code)
            if row is not None:
                platform, external_id = row.platform, row.external_id
            else:
                platform, sep, external_id = who.partition(":")
                if not sep or not external_id:
                    raise LookupError(f"{who!r} is neither a pairing code nor platform:user_id")
            changed += await pairings_sql.revoke_pairings(conn, platform, external_id, now)
            changed += await pairings_sql.delete_grants(conn, platform, external_id)
        if not changed:
            raise LookupError(f"nothing to revoke for {who!r}")
        return changed
