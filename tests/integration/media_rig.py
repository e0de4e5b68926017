"""Files through each platform's fake: a person sends a file (a photo, a document, a voice
note) the way that platform carries it, and the files Herald sent back are read from the fake.

Used with the harnesses of tests/contract/harness.py (`send_file(harness, herald, …)` and
`files_to(harness, person)`), so the same scenario runs on every platform.
"""

from __future__ import annotations

import base64
import io
import secrets
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default
from typing import Any

from PIL import Image

from tests.contract.harness import (
    DiscordHarness,
    EmailHarness,
    MattermostHarness,
    PlatformHarness,
    SignalHarness,
    SlackHarness,
    TelegramHarness,
    TwilioHarness,
)
from tests.integration.inproc import Herald

MEDIA_PLATFORMS = ("discord", "email", "mattermost", "signal", "slack", "sms", "telegram")
"""The harnesses (tests/contract/harness.py) these tests run on: each platform once."""


def picture(width: int, height: int, fmt: str = "PNG") -> bytes:
    """A picture of that size, encoded as `fmt`."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 40, 90)).save(out, fmt)
    return out.getvalue()


async def send_file(
    harness: PlatformHarness,
    herald: Herald,
    person: str,
    *,
    name: str,
    mime: str,
    data: bytes,
    caption: str = "",
) -> None:
    """Deliver a message from `person` carrying one file, as the platform would."""
    if isinstance(harness, TelegramHarness):
        await _telegram(harness, person, name=name, mime=mime, data=data, caption=caption)
    elif isinstance(harness, SlackHarness):
        shared = harness.slack.add_file(data, name, mime, user=person)
        harness.slack.inject_message(harness.DMS[person], caption, user=person, files=[shared])
    elif isinstance(harness, DiscordHarness):
        url = harness.discord.add_file(data)
        attachment = {
            "id": str(secrets.randbelow(10**18)),
            "filename": name,
            "content_type": mime,
            "size": len(data),
            "url": url,
            "proxy_url": url,
        }
        harness.discord.inject_message(
            harness.DMS[person], caption, author=person, attachments=[attachment]
        )
    elif isinstance(harness, EmailHarness):
        mail = message_from_bytes(harness._mail(person, caption), policy=default)
        assert isinstance(mail, EmailMessage)
        maintype, _, subtype = mime.partition("/")
        mail.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
        await harness.dovecot.append(mail.as_bytes())
    elif isinstance(harness, MattermostHarness):
        await harness.mm.wait_for(lambda: harness.mm.connected > 0)
        file_id = harness.mm.add_file(data, name, mime, person)
        harness.mm.inject_post(harness.DMS[person], caption, user=person, files=(file_id,))
    elif isinstance(harness, SignalHarness):
        harness.signal.say(person, caption, files=[(data, mime, name)])
    elif isinstance(harness, TwilioHarness):
        form = harness.twilio.message_form(person, caption, media=[(data, mime)])
        await harness._post(herald, form)
    else:
        raise NotImplementedError(type(harness).__name__)


async def _telegram(
    harness: TelegramHarness, person: str, *, name: str, mime: str, data: bytes, caption: str
) -> None:
    tg = harness.tg
    file_id = tg.add_file(data, file_name=name, mime_type=mime)
    if mime.startswith("image/"):
        tg.inject_message(int(person), caption, sender_id=int(person), photo=file_id)
    elif mime.startswith("audio/"):
        tg.inject_message(int(person), "", sender_id=int(person), voice=file_id)
    else:
        tg.inject_message(int(person), caption, sender_id=int(person), document=file_id)


def files_to(harness: PlatformHarness, person: str) -> list[tuple[str, int]]:
    """(name, size) of each file Herald sent `person`, in order."""
    if isinstance(harness, TelegramHarness):
        return [
            (s.upload.filename or "", len(s.upload.content))
            for s in harness.tg.sent
            if s.chat_id == int(person) and s.upload is not None
        ]
    if isinstance(harness, SlackHarness):
        return [(u.filename, len(u.content)) for u in harness.slack.uploads]
    if isinstance(harness, DiscordHarness):
        return [
            f
            for p in harness.discord.posted
            if p.channel_id == harness.DMS[person]
            for f in p.files
        ]
    if isinstance(harness, EmailHarness):
        out: list[tuple[str, int]] = []
        for r in harness.smtp.received:
            if r.rcpt_tos != (person,):
                continue
            for part in r.message.iter_attachments():
                content = part.get_content()
                size = len(content if isinstance(content, bytes) else content.encode())
                out.append((part.get_filename() or "", size))
        return out
    if isinstance(harness, MattermostHarness):
        return [(n, len(d)) for c, n, d in harness.mm.uploads if c == harness.DMS[person]]
    if isinstance(harness, SignalHarness):
        return [
            (f.filename, len(f.data))
            for s in harness.signal.sent
            if s.chat == person
            for f in s.files
        ]
    if isinstance(harness, TwilioHarness):
        return [("", len(m)) for s in harness.twilio.sent if s.to == person for m in s.media]
    raise NotImplementedError(type(harness).__name__)


def image_parts(body: dict[str, Any]) -> list[Image.Image]:
    """The pictures in the last user message of a chat-completions request."""
    for message in reversed(body.get("messages") or []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if not isinstance(content, list):
            return []
        out: list[Image.Image] = []
        for part in content:
            if part.get("type") == "image_url":
                url = str(part["image_url"]["url"])
                assert url.startswith("data:image/"), url[:40]
                data = base64.b64decode(url.partition(",")[2])
                out.append(Image.open(io.BytesIO(data)))
        return out
    return []
