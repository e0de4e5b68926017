"""Session keys: which conversation an inbound message belongs to."""

from __future__ import annotations

from gateway.contracts.config import GroupSessions
from gateway.contracts.ids import SessionKey, session_key
from gateway.contracts.messages import InboundMessage


def derive_session_key(message: InboundMessage, group_sessions: GroupSessions) -> SessionKey:
    """`platform:account:chat[:thread]`, plus `:u=<sender>` when the session is one person's.

    Direct chats whose chat id is not the sender's own get the suffix too, so two people's
    direct messages can never share a session, whatever the platform's chat ids look like.
    """
    thread = None if message.thread_id is None else _escape(message.thread_id)
    base = session_key(message.platform, message.account, _escape(message.chat_id), thread)
    sender = str(message.sender.id)
    personal = SessionKey(f"{base}:u={_escape(sender)}")
    if message.is_direct:
        return base if sender == message.chat_id else personal
    if group_sessions is GroupSessions.USER:
        return personal
    return base


def _escape(part: str) -> str:
    """A key part that cannot contain the separator (`%` and `:` percent-encoded)."""
    return part.replace("%", "%25").replace(":", "%3A").replace("=", "%3D")
