"""The email adapter against a real Dovecot (IMAP, aioimaplib unmodified) and a real SMTP
server (aiosmtpd, aiosmtplib unmodified): in the running daemon with a fake LLM, and on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from adapters.email import PLATFORM as EMAIL
from adapters.email.adapter import EmailAdapter
from adapters.email.config import EmailConfig
from adapters.email.convert import to_received
from adapters.email.imap import LIVENESS_GRACE, ImapSession, IncomingMail, MailReceiver
from gateway.checkpoints import MemoryCheckpoints
from gateway.contracts.adapter import AdapterState, InboundSink
from gateway.contracts.errors import AuthError, NotReady, PermanentSendError
from gateway.contracts.ids import AccountId, ChatId, ThreadId
from gateway.contracts.messages import Attachment, InboundMessage, OutboundMessage, utcnow
from gateway.store.tables import outbox
from tests.fakes.dovecot import USER, Dovecot
from tests.fakes.llm import FakeLLM
from tests.fakes.sink import ListSink, receiving
from tests.fakes.smtp_server import Received, SmtpServer
from tests.integration.inproc import Herald, running_daemon

pytestmark = pytest.mark.timeout(90)

ANN = "ann@example.com"
EXAMPLE_ORG = "@example.org"


@pytest.fixture
async def dovecot() -> AsyncIterator[Dovecot]:
    async with Dovecot() as server:
        yield server


@pytest.fixture
async def smtp() -> AsyncIterator[SmtpServer]:
    async with SmtpServer() as server:
        yield server


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


def section(dovecot: Dovecot, smtp: SmtpServer, **changes: Any) -> dict[str, Any]:
    """An email section reading Dovecot and sending through the SMTP server."""
    values: dict[str, Any] = {
        "allowed_senders": [ANN, EXAMPLE_ORG],
        "idle_renew": 30,
        "timeout": 5,
        **smtp.section(),
    }
    values.update(changes)
    return dovecot.section(**values)


def mail(
    text: str | None = "hello",
    *,
    sender: str = f"Ann <{ANN}>",
    subject: str = "Question",
    message_id: str | None = None,
    in_reply_to: str | None = None,
    references: str | None = None,
    html: str | None = None,
    headers: dict[str, str] | None = None,
    attachment: tuple[str, str, bytes] | None = None,
) -> tuple[bytes, str]:
    """(RFC 5322 bytes, bare Message-ID) of a mail to Herald."""
    message = EmailMessage()
    message["From"] = sender
    message["To"] = f"Herald <{USER}>"
    message["Subject"] = subject
    message["Date"] = format_datetime(utcnow())
    message["Message-ID"] = message_id or make_msgid(domain="example.com")
    if in_reply_to:
        message["In-Reply-To"] = in_reply_to
    if references:
        message["References"] = references
    for name, value in (headers or {}).items():
        message[name] = value
    if text is not None:
        message.set_content(text)
        if html is not None:
            message.add_alternative(html, subtype="html")
    elif html is not None:
        message.set_content(html, subtype="html")
    if attachment is not None:
        name, mime, data = attachment
        maintype, _, subtype = mime.partition("/")
        message.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
    return message.as_bytes(), str(message["Message-ID"]).strip("<>")


def to(address: str) -> Callable[[Received], bool]:
    return lambda r: r.rcpt_tos == (address,)


def subject_is(subject: str) -> Callable[[Received], bool]:
    return lambda r: r.header("Subject") == subject


async def rows_with_outcome(herald: Herald, count: int) -> list[dict[str, Any]]:
    return [dict(r) for r in await herald.answered(count)]


# -- the daemon, end to end ---------------------------------------------------------------------


async def test_mail_is_answered_over_smtp_threaded_and_a_reply_continues_the_session(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer, llm: FakeLLM
) -> None:
    async with running_daemon(tmp_path, llm, "email", section(dovecot, smtp)) as herald:
        data, asked_id = mail("What is **up**?\n\n-- \nAnn, sent from her desk", subject="Hi")
        uid = await dovecot.append(data)
        [reply] = await smtp.wait_for_mail(to(ANN))

        assert reply.text == "You said: What is **up**?"
        assert reply.html is not None
        assert "<strong>up</strong>" in reply.html
        assert reply.mail_from == USER
        assert reply.login == USER
        assert reply.header("From") == f"Herald <{USER}>"
        assert reply.header("To") == ANN
        assert reply.header("Subject") == "Re: Hi"
        assert reply.header("In-Reply-To") == f"<{asked_id}>"
        assert reply.header("References") == f"<{asked_id}>"
        assert reply.header("Auto-Submitted") == "auto-replied"
        reply_id = reply.header("Message-ID").strip("<>")
        assert reply_id.startswith("herald.")
        assert reply_id.endswith("@example.test")

        [row] = await rows_with_outcome(herald, 1)
        assert (row["platform_message_id"], row["outcome"]) == (asked_id, "answered")
        assert row["session_key"] == f"email:default:{ANN}:{asked_id}"
        assert (row["chat_id"], row["thread_id"], row["sender_name"]) == (ANN, asked_id, "Ann")
        await herald.until(lambda: _seen(dovecot, uid))

        # Ann answers Herald's reply from her mail client: same thread, same session.
        follow, follow_id = mail(
            "And tomorrow?\n\nOn Mon, Herald wrote:\n> You said: What is **up**?",
            subject="Re: Hi",
            in_reply_to=f"<{reply_id}>",
            references=f"<{asked_id}> <{reply_id}>",
        )
        await dovecot.append(follow)
        [second] = await smtp.wait_for_mail(lambda r: "tomorrow" in r.text)
        assert second.text == "You said: And tomorrow?"
        assert second.header("Subject") == "Re: Hi"
        assert second.header("In-Reply-To") == f"<{follow_id}>"
        assert second.header("References").split() == [
            f"<{asked_id}>",
            f"<{reply_id}>",
            f"<{follow_id}>",
        ]
        rows = await rows_with_outcome(herald, 2)
        assert [r["session_key"] for r in rows] == [f"email:default:{ANN}:{asked_id}"] * 2
        assert len(smtp.received) == 2


async def _seen(dovecot: Dovecot, uid: int) -> bool:
    return "\\Seen" in (await dovecot.flags()).get(uid, set())


async def test_html_only_mail_and_an_attachment(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer, llm: FakeLLM
) -> None:
    async with running_daemon(tmp_path, llm, "email", section(dovecot, smtp)) as herald:
        html = (
            "<html><head><style>p {color: red}</style></head><body>"
            "<p>Please read <b>this</b> <a href='https://example.com/doc'>doc</a>.</p>"
            "<blockquote>old quoted text</blockquote></body></html>"
        )
        data, _ = mail(None, html=html, sender="bob@example.org", subject="HTML")
        await dovecot.append(data)
        [reply] = await smtp.wait_for_mail(to("bob@example.org"))
        assert reply.text == "You said: Please read this doc (https://example.com/doc)."

        pdf = b"%PDF-1.4 a tiny document\n"
        data, attached_id = mail(
            "See the file", attachment=("report.pdf", "application/pdf", pdf), subject="File"
        )
        await dovecot.append(data)
        await smtp.wait_for_mail(to(ANN))
        rows = await rows_with_outcome(herald, 2)
        row = next(r for r in rows if r["platform_message_id"] == attached_id)
        [stored] = row["payload"]["attachments"]
        assert (stored["filename"], stored["mime_type"], stored["size"]) == (
            "report.pdf",
            "application/pdf",
            len(pdf),
        )
        assert await asyncio.to_thread(Path(stored["path"]).read_bytes) == pdf


async def test_disallowed_automatic_bounced_and_own_mail_is_recorded_and_not_answered(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer, llm: FakeLLM
) -> None:
    async with running_daemon(tmp_path, llm, "email", section(dovecot, smtp)) as herald:
        stranger, stranger_id = mail("let me in", sender="eve@elsewhere.test")
        vacation, vacation_id = mail(
            "I am away", headers={"Auto-Submitted": "auto-replied"}, subject="Out of office"
        )
        bounce, bounce_id = mail(
            "Delivery failed", sender="MAILER-DAEMON@example.com", subject="Undelivered"
        )
        own, own_id = mail("talking to myself", sender=f"Herald <{USER}>")
        listed, listed_id = mail("newsletter", headers={"List-Id": "<news.example.com>"})
        for data in (stranger, vacation, bounce, own, listed):
            await dovecot.append(data)
        # An allowed person's mail after them is answered: they were all handled first.
        data, ok_id = mail("are you there?")
        await dovecot.append(data)
        [reply] = await smtp.wait_for_mail(to(ANN))
        assert reply.text == "You said: are you there?"

        rows = {r["platform_message_id"]: r for r in await rows_with_outcome(herald, 6)}
        assert rows[ok_id]["outcome"] == "answered"
        details = {
            stranger_id: "sender not allowed",
            vacation_id: "Auto-Submitted: auto-replied",
            bounce_id: "automatic sender mailer-daemon@example.com",
            own_id: "mail from Herald's own address",
            listed_id: "List-Id header",
        }
        for key, detail in details.items():
            assert (rows[key]["outcome"], rows[key]["outcome_detail"]) == ("rejected", detail)
        assert len(smtp.received) == 1
        flags = await dovecot.flags()
        assert all("\\Seen" in f for f in flags.values())  # every one handled for good


async def test_a_strangers_attachments_are_not_written_to_disk(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer, llm: FakeLLM
) -> None:
    pdf = b"%PDF-1.4 " + b"x" * 2000
    async with running_daemon(tmp_path, llm, "email", section(dovecot, smtp)) as herald:
        data, stranger_id = mail(
            "read this", sender="eve@elsewhere.test", attachment=("a.pdf", "application/pdf", pdf)
        )
        await dovecot.append(data)
        data, ann_id = mail("mine", attachment=("b.pdf", "application/pdf", pdf))
        await dovecot.append(data)
        await smtp.wait_for_mail(to(ANN))
        rows = {r["platform_message_id"]: r for r in await rows_with_outcome(herald, 2)}
        assert rows[stranger_id]["outcome"] == "rejected"
        assert rows[stranger_id]["text"] == "Question"  # the subject: the body was never read
        assert list((await herald.kept_files()).values()) == [pdf]  # Ann's only
        assert rows[ann_id]["outcome"] == "answered"


async def test_mail_that_arrives_while_stopped_is_answered_once_after_restart(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer, llm: FakeLLM
) -> None:
    cfg = section(dovecot, smtp)
    old, _ = mail("read before Herald ever ran")
    await dovecot.append(old)
    first_uid = max((await dovecot.flags()).keys())
    async with running_daemon(tmp_path, llm, "email", cfg) as herald:
        # Unseen mail from before the first start is news too.
        await smtp.wait_for_mail(1)
        await herald.answered(1)
    data, late_id = mail("sent while you were down", subject="Later")
    await dovecot.append(data)
    async with running_daemon(tmp_path, llm, "email", cfg) as herald:
        [reply] = await smtp.wait_for_mail(lambda r: "down" in r.text)
        assert reply.header("In-Reply-To") == f"<{late_id}>"
        await herald.answered(2)
    async with running_daemon(tmp_path, llm, "email", cfg) as herald:
        data, _ = mail("one more")
        await dovecot.append(data)
        await smtp.wait_for_mail(3)
        rows = await herald.answered(3)
    assert len(smtp.received) == 3  # nothing answered twice across the restarts
    assert len({r["platform_message_id"] for r in rows}) == 3
    assert first_uid in await dovecot.flags()


async def test_a_dropped_imap_connection_reconnects_and_loses_nothing(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer, llm: FakeLLM
) -> None:
    async with running_daemon(tmp_path, llm, "email", section(dovecot, smtp)) as herald:
        data, _ = mail("before the drop")
        await dovecot.append(data)
        await smtp.wait_for_mail(1)

        await dovecot.kick()  # the server ends the IDLE session
        data, _ = mail("right after the drop")
        await dovecot.append(data)
        await dovecot.restart()  # and then goes away altogether for a moment
        data, _ = mail("after the restart")
        await dovecot.append(data)

        received = await smtp.wait_for_mail(3)
        assert sorted(r.text for r in received) == [
            "You said: after the restart",
            "You said: before the drop",
            "You said: right after the drop",
        ]
        await herald.answered(3)
        await herald.until(lambda: herald.adapter_state() is AdapterState.RECEIVING)
        assert await herald.ready() == 200


async def test_session_by_sender_keeps_one_session_per_correspondent(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer, llm: FakeLLM
) -> None:
    cfg = section(dovecot, smtp, session_by="sender")
    async with running_daemon(tmp_path, llm, "email", cfg) as herald:
        for subject in ("One", "Two"):
            data, _ = mail("hi", subject=subject)
            await dovecot.append(data)
            await smtp.wait_for_mail(subject_is(f"Re: {subject}"))
        rows = await rows_with_outcome(herald, 2)
        assert {r["session_key"] for r in rows} == {f"email:default:{ANN}"}
        assert rows[0]["text"] == "Subject: One\n\nhi"


# -- the adapter on its own ---------------------------------------------------------------------


def adapter(
    tmp_path: Path,
    dovecot: Dovecot,
    smtp: SmtpServer,
    checkpoints: MemoryCheckpoints | None = None,
    **changes: Any,
) -> EmailAdapter:
    config = EmailConfig.model_validate(section(dovecot, smtp, **changes))
    return EmailAdapter(config, tmp_path / "files", checkpoints or MemoryCheckpoints())


def outbound(text: str, chat: str = ANN, thread: str | None = None) -> OutboundMessage:
    return OutboundMessage(
        platform=EMAIL,
        account=AccountId("default"),
        chat_id=ChatId(chat),
        text=text,
        idempotency_key="k",
        thread_id=ThreadId(thread) if thread else None,
    )


async def test_smtp_errors_transient_then_permanent(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer
) -> None:
    async with adapter(tmp_path, dovecot, smtp) as email:
        smtp.refusals = ["451 4.3.0 try again later", "550 5.1.1 no such user"]
        with pytest.raises(NotReady, match="451"):
            await email.send(outbound("one"))
        with pytest.raises(PermanentSendError, match="550"):
            await email.send(outbound("two"))
        receipt = await email.send(outbound("three"))
        [sent] = smtp.received
        assert sent.text == "three"
        assert sent.header("Subject") == "Message from Herald"  # no conversation to answer
        assert f"<{receipt.platform_message_id}>" == sent.header("Message-ID")
        with pytest.raises(PermanentSendError, match="not an address"):
            await email.send(outbound("four", chat="not-an-address"))


async def test_attachments_go_out_with_the_reply(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer
) -> None:
    path = tmp_path / "chart.png"
    path.write_bytes(b"\x89PNG fake")
    async with adapter(tmp_path, dovecot, smtp) as email:
        attachment = Attachment(path, "image/png", 9, "chart.png")
        await email.send(replace(outbound("here it is"), attachments=(attachment,)))
    [sent] = smtp.received
    [part] = list(sent.message.iter_attachments())
    assert part.get_filename() == "chart.png"
    assert part.get_content_type() == "image/png"
    assert part.get_content() == b"\x89PNG fake"


async def test_wrong_password_is_an_auth_error(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer
) -> None:
    with pytest.raises(AuthError, match="IMAP login refused"):
        async with adapter(tmp_path, dovecot, smtp, password="wrong"):
            pass


async def test_uidvalidity_change_reads_unseen_mail_again_and_the_inbox_dedupes(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer
) -> None:
    checkpoints = MemoryCheckpoints()
    data, first_id = mail("first")
    await dovecot.append(data)
    sink = ListSink()
    async with adapter(tmp_path, dovecot, smtp, checkpoints) as email, receiving(email, sink):
        await sink.until_stored(1)
        await until_set(checkpoints, "watermark:INBOX", lambda v: v.endswith(":1"))
    # The server renumbered the folder: the old watermark says nothing any more.
    await checkpoints.set("watermark:INBOX", "1:999")
    data, second_id = mail("second")
    await dovecot.append(data)
    async with adapter(tmp_path, dovecot, smtp, checkpoints) as email, receiving(email, sink):
        await sink.until_stored(2)
    assert [m.platform_message_id for m in sink.messages] == [first_id, second_id]


async def until_set(
    checkpoints: MemoryCheckpoints, name: str, check: Callable[[str], bool]
) -> None:
    """Wait until the checkpoint `name` holds a value passing `check` (polled)."""
    async with asyncio.timeout(10):
        while not check(await checkpoints.get(name) or ""):
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("server_moves", [True, False])
async def test_mail_is_moved_when_configured(
    tmp_path: Path, smtp: SmtpServer, server_moves: bool
) -> None:
    capabilities = "" if server_moves else "imap_capability = IMAP4rev1 IDLE UIDPLUS"
    async with Dovecot(extra_config=capabilities) as dovecot:
        await _moved(tmp_path, dovecot, smtp)


async def _moved(tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer) -> None:
    await dovecot.create_folder("Done")
    data, _ = mail("move me")
    await dovecot.append(data)
    sink = ListSink()
    email = adapter(tmp_path, dovecot, smtp, after_receipt="move", move_to="Done")
    async with email, receiving(email, sink):
        await sink.until_stored(1)
        async with asyncio.timeout(10):
            while await dovecot.flags():
                await asyncio.sleep(0.05)
    assert len(await dovecot.flags("Done")) == 1


async def test_check_logs_in_to_both_servers(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer
) -> None:
    detail = await adapter(tmp_path, dovecot, smtp).check()
    assert detail.startswith(f"{USER}: IMAP 127.0.0.1 INBOX (UIDVALIDITY ")
    assert detail.endswith(f"IDLE; SMTP 127.0.0.1:{smtp.port} login ok")
    smtp.password = "changed"
    with pytest.raises(AuthError, match="SMTP login refused"):
        await adapter(tmp_path, dovecot, smtp).check()


async def test_polling_when_the_server_has_no_idle(tmp_path: Path, smtp: SmtpServer) -> None:
    no_idle = "imap_capability = IMAP4rev1 LITERAL+ UIDPLUS MOVE"
    async with Dovecot(extra_config=no_idle) as dovecot:
        sink = ListSink()
        email = adapter(tmp_path, dovecot, smtp, poll_interval=0.2)
        async with email, receiving(email, sink):
            assert email.receiver.idles == 0
            for n in range(2):
                data, _ = mail(f"poll {n}")
                await dovecot.append(data)
                await sink.until_stored(n + 1)
        assert email.receiver.idles == 0
        assert sink.texts == ["poll 0", "poll 1"]


async def test_idle_is_renewed_and_liveness_follows_it(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer
) -> None:
    now = [1000.0]
    config = EmailConfig.model_validate(section(dovecot, smtp, idle_renew=0.2))
    receiver = MailReceiver(config, MemoryCheckpoints(), _store_text, clock=lambda: now[0])
    sink = ListSink()
    assert receiver.liveness() is AdapterState.STARTING
    async with ImapSession(config) as session:
        task = asyncio.create_task(receiver.run(session, sink))
        try:
            await _until(lambda: receiver.idles >= 3)  # re-issued twice already
            assert receiver.liveness() is AdapterState.RECEIVING
            data, _ = mail("still listening")
            await dovecot.append(data)
            await sink.until_stored(1)
            now[0] += 0.2 + config.timeout + LIVENESS_GRACE + 1  # no renewal since: quiet
            assert receiver.liveness() is AdapterState.RECONNECTING
            await _until(lambda: receiver.liveness() is AdapterState.RECEIVING)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert sink.texts == ["still listening"]


async def _store_text(mail: IncomingMail, sink: InboundSink) -> None:
    config = EmailConfig.model_validate(
        {"imap_host": "x", "smtp_host": "x", "username": "u", "password": "p", "address": USER}
    )
    data = await mail.fetch()
    assert data is not None
    received = to_received(
        data,
        config=config,
        account=AccountId("t"),
        uidvalidity=mail.uidvalidity,
        uid=mail.uid,
        now=utcnow(),
    )
    await sink.accept(received.message)


async def _until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("security", ["tls", "starttls"])
async def test_tls_and_starttls_to_both_servers(tmp_path: Path, security: str) -> None:
    async with Dovecot(tls=True) as dovecot:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(dovecot.root / "cert.pem", dovecot.root / "key.pem")
        async with SmtpServer(tls=context, implicit_tls=security == "tls") as smtp:
            port = dovecot.tls_port if security == "tls" else dovecot.port
            email = adapter(
                tmp_path, dovecot, smtp, imap_port=port, imap_security=security, tls_verify=False
            )
            assert "login ok" in await email.check()
            data, _ = mail("over TLS")
            await dovecot.append(data)
            sink = ListSink()
            async with email, receiving(email, sink):
                await sink.until_stored(1)
                await email.send(outbound("secret reply"))
            [sent] = smtp.received
            assert sent.text == "secret reply"
            assert sink.texts == ["over TLS"]
            # Checking certificates is the default: a self-signed one is refused.
            strict = adapter(tmp_path, dovecot, smtp, imap_port=port, imap_security=security)
            with pytest.raises(NotReady, match="CERTIFICATE_VERIFY_FAILED"):
                await strict.check()


async def test_a_transient_smtp_refusal_is_retried_and_a_permanent_one_dead_letters(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer, llm: FakeLLM
) -> None:
    async with running_daemon(tmp_path, llm, "email", section(dovecot, smtp)) as herald:
        smtp.refusals = ["451 4.3.0 greylisted, try again later"]
        data, _ = mail("first try fails")
        await dovecot.append(data)
        [reply] = await smtp.wait_for_mail(1)
        assert reply.text == "You said: first try fails"
        assert smtp.attempts == 2

        smtp.refusals = ["550 5.1.1 mailbox unavailable"]
        data, _ = mail("never deliverable")
        await dovecot.append(data)
        await herald.until(lambda: smtp.attempts == 3)

        async def dead() -> bool:
            async with herald.store.read() as conn:
                rows = (await conn.execute(select(outbox))).mappings().all()
            return [r["status"] for r in rows] == ["sent", "dead"]

        await herald.until(dead)
        assert len(smtp.received) == 1


# -- hostile mail -------------------------------------------------------------------------------

ANSWER_BOUND = 15.0
"""Seconds an allowed person's mail may wait behind hostile ones: far above a normal answer on
a loaded machine, far below what parsing them took before (about 37 s and 6.5 s)."""


def long_line_mail(sender: str) -> tuple[bytes, str]:
    """A 450,000-character line (sent as it is, 7bit) that made the attribution pattern take
    half a minute."""
    message_id = make_msgid(domain="elsewhere.test")
    head = (
        f"From: {sender}\r\nTo: {USER}\r\nSubject: Long line\r\nMessage-ID: {message_id}\r\n"
        "Content-Type: text/plain; charset=us-ascii\r\nContent-Transfer-Encoding: 7bit\r\n\r\n"
    )
    return (head + "hi\r\n" + " <a" * 150_000 + "\r\n").encode(), message_id.strip("<>")


def many_parts_mail(sender: str, parts: int = 20_000) -> tuple[bytes, str]:
    """`parts` tiny MIME parts in one mail (about 1.8 MB)."""
    message_id = make_msgid(domain="elsewhere.test")
    head = (
        f"From: {sender}\r\nTo: {USER}\r\nSubject: Many parts\r\nMessage-ID: {message_id}\r\n"
        'MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="b"\r\n\r\n'
    )
    body = "".join("--b\r\nContent-Type: text/plain\r\n\r\nx\r\n" for _ in range(parts))
    return (head + body + "--b--\r\n").encode(), message_id.strip("<>")


async def test_hostile_mail_costs_nothing_and_the_next_mail_is_answered_meanwhile(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer, llm: FakeLLM
) -> None:
    """A stranger's mail is decided on its headers (its body is never fetched nor parsed);
    an allowed person's mail over the limits is refused unread; both are flagged seen, and a
    mail behind them is answered within a bound while `/health` keeps answering."""
    async with running_daemon(tmp_path, llm, "email", section(dovecot, smtp)) as herald:
        stranger_long, stranger_long_id = long_line_mail("eve@elsewhere.test")
        stranger_parts, stranger_parts_id = many_parts_mail("eve@elsewhere.test")
        ann_long, ann_long_id = long_line_mail(f"Ann <{ANN}>")
        ann_parts, ann_parts_id = many_parts_mail(ANN)
        for data in (stranger_long, stranger_parts, ann_long, ann_parts):
            await dovecot.append(data)
        data, ok_id = mail("are you there?")
        await dovecot.append(data)
        async with asyncio.timeout(ANSWER_BOUND):
            async with httpx.AsyncClient(timeout=ANSWER_BOUND, trust_env=False) as client:
                assert (await client.get(f"{herald.url}/health")).status_code == 200
            [reply] = await smtp.wait_for_mail(to(ANN), timeout=ANSWER_BOUND)
        assert reply.text == "You said: are you there?"

        rows = {r["platform_message_id"]: r for r in await rows_with_outcome(herald, 5)}
        assert rows[ok_id]["outcome"] == "answered"
        for key in (stranger_long_id, stranger_parts_id):
            assert (rows[key]["outcome"], rows[key]["outcome_detail"]) == (
                "rejected",
                "sender not allowed",
            )
        assert rows[ann_long_id]["outcome"] == "rejected"
        assert rows[ann_long_id]["outcome_detail"] == (
            "mail not read: a line of 450001 bytes (limit 100000)"
        )
        assert rows[ann_parts_id]["outcome"] == "rejected"
        assert rows[ann_parts_id]["outcome_detail"] == "mail not read: more than 100 MIME parts"
        flags = await dovecot.flags()
        assert len(flags) == 5
        assert all("\\Seen" in f for f in flags.values())  # never read again after a restart


class ScreeningListSink(ListSink):
    """A sink that, like the daemon's, tells whether a sender's mail is wanted."""

    def __init__(self, allowed: set[str]) -> None:
        super().__init__()
        self.allowed = allowed

    async def may_fetch(self, message: InboundMessage) -> bool:
        return str(message.sender.id) in self.allowed


async def test_a_strangers_body_is_never_fetched(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer
) -> None:
    config = EmailConfig.model_validate(section(dovecot, smtp))
    email = EmailAdapter(config, tmp_path / "files", MemoryCheckpoints())
    fetched: list[int] = []

    async def receive(mail: IncomingMail, sink: InboundSink) -> None:
        """The adapter's own receive, with each whole-mail fetch counted."""

        async def counted() -> bytes | None:
            fetched.append(mail.uid)
            return await mail.fetch()

        await email._receive(replace(mail, fetch=counted), sink)

    stranger, _ = many_parts_mail("eve@elsewhere.test")
    stranger_uid = await dovecot.append(stranger)
    data, _ = mail("hello")
    ann_uid = await dovecot.append(data)
    sink = ScreeningListSink({ANN})
    receiver = MailReceiver(config, MemoryCheckpoints(), receive)
    async with ImapSession(config) as session:
        task = asyncio.create_task(receiver.run(session, sink))
        try:
            await sink.until_stored(2)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert fetched == [ann_uid]
    assert stranger_uid not in fetched
    assert sink.texts == ["Many parts", "hello"]


def strict_section(dovecot: Dovecot, smtp: SmtpServer) -> dict[str, Any]:
    return section(
        dovecot, smtp, require_authentication_results=True, authserv_id="mx.example.test"
    )


MX_RECEIVED = "from evil.example (evil.example [192.0.2.66]) by mx.example.test with ESMTPS"


def authenticated_mail(text: str, *top: tuple[str, str], sender: str = ANN) -> tuple[bytes, str]:
    """A mail whose header block starts with `top` (name, value), then the MX's Received."""
    data, message_id = mail(text, sender=sender)
    prefix = "".join(f"{name}: {value}\r\n" for name, value in top)
    return prefix.encode() + data.replace(b"\n", b"\r\n"), message_id


async def test_only_the_receiving_servers_authentication_results_count(
    tmp_path: Path, dovecot: Dovecot, smtp: SmtpServer, llm: FakeLLM
) -> None:
    """Forged results (another authserv-id; ours below the MX's Received; a quoted local part
    with a semicolon) are refused; the receiving server's own pass is answered."""
    ar = "Authentication-Results"
    real_fail = (ar, "mx.example.test; spf=fail smtp.mailfrom=evil.example")
    received = ("Received", MX_RECEIVED)
    forged_other = (ar, "attacker.example; dkim=pass header.d=example.com")
    forged_ours = (ar, "mx.example.test; dkim=pass header.d=example.com")
    quoted = (
        ar,
        'mx.example.test; spf=pass smtp.mailfrom="x;dkim=pass header.d=example.com "@evil.example',
    )
    genuine = (ar, "mx.example.test;\r\n\tdkim=pass header.d=example.com header.s=mail")
    async with running_daemon(tmp_path, llm, "email", strict_section(dovecot, smtp)) as herald:
        mails = [
            authenticated_mail("forged elsewhere", real_fail, received, forged_other),
            authenticated_mail("forged below", real_fail, received, forged_ours),
            authenticated_mail("quoted", quoted, received),
            authenticated_mail("genuine", genuine, received),
        ]
        for data, _ in mails:
            await dovecot.append(data)
        [reply] = await smtp.wait_for_mail(to(ANN))
        assert reply.text == "You said: genuine"
        rows = {r["platform_message_id"]: r for r in await rows_with_outcome(herald, 4)}
        refused = "no passing DKIM or SPF result from mx.example.test for the sender's domain"
        for _, key in mails[:3]:
            assert (rows[key]["outcome"], rows[key]["outcome_detail"]) == ("rejected", refused)
        assert rows[mails[3][1]]["outcome"] == "answered"
        assert len(smtp.received) == 1
