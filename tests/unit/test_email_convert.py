"""Pure mail conversions against recorded mails (tests/data/email/*.eml)."""

from __future__ import annotations

from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from adapters.email import authres
from adapters.email.config import EmailConfig
from adapters.email.convert import (
    ReceivedMail,
    ThreadState,
    attachments_of,
    authenticated,
    build_reply,
    html_to_text,
    is_address,
    new_message_id,
    parse,
    reply_subject,
    strip_quoted,
    thread_root,
    to_received,
)
from gateway.contracts.ids import AccountId

DATA = Path(__file__).parent.parent / "data" / "email"
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
HERALD = "herald@example.test"


def config(**changes: Any) -> EmailConfig:
    values: dict[str, Any] = {
        "imap_host": "imap.example.test",
        "smtp_host": "smtp.example.test",
        "username": HERALD,
        "password": "secret",
        "address": HERALD,
    }
    values.update(changes)
    return EmailConfig.model_validate(values)


def received(name: str, **changes: Any) -> ReceivedMail:
    return to_received(
        (DATA / name).read_bytes(),
        config=config(**changes),
        account=AccountId("default"),
        uidvalidity=7,
        uid=3,
        now=NOW,
    )


def test_a_plain_reply_loses_its_quote_and_signature_and_keeps_its_thread() -> None:
    mail = received("thunderbird_reply.eml")
    m = mail.message
    assert m.text == "Thanks! Can you also compare them with last year’s?\n\nAnn"
    assert (m.chat_id, m.sender.id, m.sender.display_name) == (
        "ann@example.com",
        "ann@example.com",
        "Ann Example",
    )
    assert m.platform_message_id == "7d1c2b3a-9f00-4a55-8c1e-5d2f6a7b8c9d@example.com"
    assert m.thread_id == "root-1234@example.com"  # the first of References
    assert m.reply_to == "herald.170000000.1.2@example.test"
    assert m.received_at == datetime(2026, 11, 23, 9, 15, 2, tzinfo=UTC)
    assert m.raw["subject"] == "Re: Re: Quarterly numbers"
    assert "refused" not in m.raw
    assert not m.sender.is_bot
    assert mail.references == (
        "root-1234@example.com",
        "herald.170000000.1.2@example.test",
        "7d1c2b3a-9f00-4a55-8c1e-5d2f6a7b8c9d@example.com",
    )


def test_session_by_sender_has_no_thread_and_tells_the_subject() -> None:
    m = received("thunderbird_reply.eml", session_by="sender").message
    assert m.thread_id is None
    assert m.text.startswith("Subject: Re: Re: Quarterly numbers\n\nThanks!")


def test_html_only_mail_becomes_text_without_the_quoted_original() -> None:
    m = received("outlook_html_only.eml").message
    assert m.text == (
        "Hi Herald,\n\n"
        "Can we move the site visit to Thursday? The café is closed on Wednesday.\n\n"
        "• Bring boots\n"
        "• See the map (https://example.org/map)\n\n"
        "Bob"
    )
    assert m.thread_id == str(m.platform_message_id)  # a new thread starts at its first mail


def test_attachments_are_kept_up_to_the_size_limit() -> None:
    mail = received("multipart_attachment.eml", attachment_max_bytes=60)
    assert mail.message.raw["subject"] == "Invoice — November"
    [pdf] = mail.files
    assert (pdf.filename, pdf.mime_type) == ("invoice-11.pdf", "application/pdf")
    assert pdf.data.startswith(b"%PDF-1.4")
    assert mail.too_large == ("big.png",)
    assert mail.message.text == (
        "Please check the attached invoice.\n[attachment big.png left out: larger than 60 bytes]"
    )


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("vacation.eml", "Auto-Submitted: auto-replied"),
        ("bounce.eml", "automatic sender mailer-daemon@mx.example.test"),
        ("mailing_list.eml", "Precedence: list"),
    ],
)
def test_automatic_mail_is_refused(name: str, reason: str) -> None:
    mail = received(name)
    assert mail.message.raw["refused"] == reason
    assert mail.message.sender.is_bot
    assert mail.files == ()


def test_mail_from_herald_itself_is_refused() -> None:
    m = received("thunderbird_reply.eml", address="Ann@example.com").message
    assert m.raw["refused"] == "mail from Herald's own address"


def test_mail_without_a_message_id_is_keyed_by_uid() -> None:
    m = received("no_message_id.eml").message
    assert m.platform_message_id == "uid:7:3"
    assert m.thread_id == "uid:7:3"
    assert m.received_at == NOW  # no Date header either


STRICT = {"require_authentication_results": True, "authserv_id": "mx.example.test"}


def test_authentication_results_are_required_when_configured() -> None:
    assert "refused" not in received("spoofed.eml").message.raw
    strict = received("spoofed.eml", **STRICT).message
    assert strict.raw["refused"] == (
        "no passing DKIM or SPF result from mx.example.test for the sender's domain"
    )
    good = received("thunderbird_reply.eml", **STRICT).message
    assert "refused" not in good.raw
    mail = parse((DATA / "thunderbird_reply.eml").read_bytes())
    assert authenticated(mail, "ann@example.com", "mx.example.test")
    assert authenticated(mail, "someone@sub.example.com", "mx.example.test") is False
    assert authenticated(mail, "ann@example.com", "other.example") is False


def _with_results(*headers: str, sender: str = "ann@example.com") -> bytes:
    """A mail from `sender` whose header block starts with `headers` (top first)."""
    lines = [*headers, f"From: Ann <{sender}>", "To: herald@example.test", "Subject: hi"]
    return (
        "\r\n".join([*lines, "Message-ID: <m-1@example.com>", "", "Wire the money.", ""])
    ).encode()


def _strict(data: bytes, **changes: Any) -> str | None:
    mail = to_received(
        data,
        config=config(**STRICT, **changes),
        account=AccountId("default"),
        uidvalidity=7,
        uid=3,
        now=NOW,
    )
    refused = mail.message.raw.get("refused")
    return refused if isinstance(refused, str) else None


MX_RECEIVED = "Received: from evil.example (evil.example [192.0.2.66]) by mx.example.test"


def test_a_genuine_result_of_the_receiving_server_is_accepted() -> None:
    genuine = "Authentication-Results: mx.example.test;\r\n\tdkim=pass header.d=example.com"
    assert _strict(_with_results(genuine, MX_RECEIVED)) is None
    spf = "Authentication-Results: MX.Example.Test 1; spf=pass smtp.mailfrom=ann@example.com"
    assert _strict(_with_results(spf, MX_RECEIVED)) is None
    # Comments and quoted strings where RFC 8601 allows them.
    commented = (
        "Authentication-Results: mx.example.test (the MX); spf=pass (ok)"
        ' smtp.mailfrom="ann"@example.com; dkim=fail header.d=other.example'
    )
    assert _strict(_with_results(commented, MX_RECEIVED)) is None
    # A delivery agent that adds its own Received above the server's results (Dovecot's LMTP).
    lmtp = "Received: from mx.example.test by imap.example.test with LMTP"
    assert _strict(_with_results(lmtp, genuine, MX_RECEIVED)) is not None
    assert _strict(_with_results(lmtp, genuine, MX_RECEIVED), received_above_results=1) is None


def test_results_the_sender_wrote_do_not_count() -> None:
    real_fail = "Authentication-Results: mx.example.test; spf=fail smtp.mailfrom=evil.example"
    forged_other_id = "Authentication-Results: attacker.example; dkim=pass header.d=example.com"
    forged_same_id = "Authentication-Results: mx.example.test; dkim=pass header.d=example.com"
    # Another authserv-id, wherever it stands: ignored.
    assert _strict(_with_results(real_fail, forged_other_id, MX_RECEIVED)) is not None
    assert _strict(_with_results(forged_other_id, real_fail, MX_RECEIVED)) is not None
    # The configured authserv-id below the receiving server's Received: the sender's words.
    assert _strict(_with_results(real_fail, MX_RECEIVED, forged_same_id)) is not None
    assert _strict(_with_results(MX_RECEIVED, forged_same_id)) is not None
    # The same with LMTP's Received on top and received_above_results: 1.
    lmtp = "Received: from mx.example.test by imap.example.test with LMTP"
    forged = _with_results(lmtp, real_fail, MX_RECEIVED, forged_same_id)
    assert _strict(forged, received_above_results=1) is not None


def test_a_quoted_semicolon_is_not_a_clause_boundary() -> None:
    sneaky = (
        "Authentication-Results: mx.example.test; spf=pass"
        ' smtp.mailfrom="x;dkim=pass header.d=example.com "@evil.example'
    )
    assert _strict(_with_results(sneaky, MX_RECEIVED)) is not None
    # A quoted string that never closes, or a stray parenthesis: the header counts as nothing.
    for broken in (
        'Authentication-Results: mx.example.test; dkim=pass header.d="example.com',
        "Authentication-Results: mx.example.test; dkim=pass header.d=example.com)",
        "Authentication-Results: mx.example.test; dkim=pass (header.d=example.com",
        "Authentication-Results: mx.example.test; dkim=pass header.d",
    ):
        assert _strict(_with_results(broken, MX_RECEIVED)) is not None, broken


def test_a_comment_cannot_hide_or_forge_a_clause() -> None:
    hidden = (
        "Authentication-Results: mx.example.test; spf=fail (a; dkim=pass"
        " header.d=example.com (nested) ) smtp.mailfrom=evil.example"
    )
    assert _strict(_with_results(hidden, MX_RECEIVED)) is not None
    parsed = authres.parse(hidden.partition(":")[2])
    assert parsed is not None
    assert [(r.method, r.result) for r in parsed.results] == [("spf", "fail")]
    assert parsed.results[0].properties == (("smtp.mailfrom", "evil.example"),)


def test_a_second_from_header_cannot_borrow_a_signed_mails_pass() -> None:
    genuine = "Authentication-Results: mx.example.test; dkim=pass header.d=example.com"
    signed = _with_results(genuine, MX_RECEIVED)
    assert _strict(signed) is None
    replayed = b"From: Boss <boss@example.com>\r\n" + signed
    assert _strict(replayed) == "2 From headers"


def test_require_authentication_results_needs_an_authserv_id() -> None:
    with pytest.raises(ValueError, match="require_authentication_results needs authserv_id"):
        config(require_authentication_results=True)
    assert config(**STRICT).authserv_id == "mx.example.test"


def test_strip_quoted_keeps_an_all_quoted_text() -> None:
    assert strip_quoted("> only a quote") == "> only a quote"
    assert strip_quoted("New text\n\n-----Original Message-----\nold") == "New text"
    assert strip_quoted("Yes\n\nOn Mon, 23 Nov 2026 at 10:00, Ann <a@b.c>\nwrote:\n> x") == "Yes"
    assert strip_quoted("Sure\n\nSent from my iPhone") == "Sure"


def test_html_to_text_drops_scripts_and_keeps_structure() -> None:
    source = (
        "<script>alert(1)</script><h1>Title</h1><p>One<br>Two &amp; three</p>"
        "<pre>  code\n  block</pre><a href='javascript:x()'>link</a>"
    )
    assert html_to_text(source) == "Title\n\nOne\nTwo & three\n\ncode\nblock\nlink"


def test_thread_root_prefers_references_then_in_reply_to() -> None:
    mail = parse(b"Message-ID: <c@x>\r\nIn-Reply-To: <b@x>\r\n\r\nhi\r\n")
    assert thread_root(mail) == "b@x"
    assert thread_root(parse(b"Message-ID: <c@x>\r\n\r\nhi\r\n")) == "c@x"


def test_reply_subject_does_not_pile_up_prefixes() -> None:
    assert reply_subject("Re: Re: Quarterly numbers") == "Re: Quarterly numbers"
    assert reply_subject("AW: Frage") == "Re: Frage"
    assert reply_subject("") == "Re: your message"


def test_a_reply_is_threaded_multipart_and_marked_automatic() -> None:
    cfg = config(display_name="Herald Bot")
    state = ThreadState("Re: Quarterly numbers", "ask@example.com", ("root@example.com",))
    message_id = new_message_id(HERALD)
    mail = build_reply(
        config=cfg,
        to="ann@example.com",
        text="Here you go: **bold** <script>",
        markdown=True,
        state=state,
        in_reply_to=None,
        message_id=message_id,
        now=NOW,
    )
    assert mail["From"] == f"Herald Bot <{HERALD}>"
    assert mail["To"] == "ann@example.com"
    assert mail["Subject"] == "Re: Quarterly numbers"
    assert mail["In-Reply-To"] == "<ask@example.com>"
    assert mail["References"] == "<root@example.com> <ask@example.com>"
    assert mail["Auto-Submitted"] == "auto-replied"
    assert mail["Message-ID"] == message_id
    assert message_id.startswith("<herald.")
    assert message_id.endswith("@example.test>")
    plain = mail.get_body(preferencelist=("plain",))
    html = mail.get_body(preferencelist=("html",))
    assert plain is not None
    assert html is not None
    assert plain.get_content() == "Here you go: **bold** <script>\n"
    assert "<strong>bold</strong> &lt;script&gt;" in html.get_content()
    # Plain text goes out as plain text only.
    plain_only = build_reply(
        config=cfg,
        to="ann@example.com",
        text="x",
        markdown=False,
        state=None,
        in_reply_to=None,
        message_id=message_id,
        now=NOW,
    )
    assert plain_only.get_content_type() == "text/plain"
    assert plain_only["Subject"] == "Message from Herald Bot"
    assert plain_only["In-Reply-To"] is None


def test_thread_state_round_trips_and_rejects_junk() -> None:
    state = ThreadState("S", "id@x", ("a@x",))
    assert ThreadState.from_json(state.to_json()) == state
    assert ThreadState.from_json({"subject": 1}) is None
    assert ThreadState.from_json([]) is None


def test_addresses() -> None:
    assert is_address("ann@example.com")
    assert not is_address("Ann <ann@example.com>")
    assert not is_address("ann@localhost")
    assert not is_address("not-an-address")


def test_allowed_senders_match_addresses_and_domains() -> None:
    cfg = config(allowed_senders=["Ann@Example.com", "@example.org"])
    assert cfg.admits_address("ann@example.com")
    assert cfg.admits_address("bob@example.org")
    assert not cfg.admits_address("eve@sub.example.org")
    assert not cfg.admits_address("eve@example.net")
    assert not config().pairing  # unknown senders are ignored unless pairing is turned on


def test_config_validation() -> None:
    assert config(allowed_senders="@example.org").allowed_senders == ("@example.org",)
    assert config(address="Herald@Example.TEST").address == "herald@example.test"
    with pytest.raises(ValueError, match="move_to must differ from folder"):
        config(after_receipt="move", move_to="INBOX")
    with pytest.raises(ValueError, match="address"):
        config(address="not an address")


def test_inline_images_of_an_html_body_are_attachments_too() -> None:
    """A picture embedded in an HTML mail (`multipart/related` inside `multipart/mixed`) is
    kept like an attached one, after the attachments."""
    mail = EmailMessage()
    mail.set_content("hello")
    mail.add_alternative("<p>look <img src='cid:pic'></p>", subtype="html")
    html = next(p for p in mail.iter_parts() if p.get_content_type() == "text/html")
    assert isinstance(html, EmailMessage)
    html.add_related(b"\x89PNG", maintype="image", subtype="png", cid="<pic>", filename="p.png")
    mail.add_attachment(b"%PDF", maintype="application", subtype="pdf", filename="a.pdf")
    assert attachments_of(mail) == [
        ("a.pdf", "application/pdf", b"%PDF"),
        ("p.png", "image/png", b"\x89PNG"),
    ]


def test_a_from_that_reads_two_ways_names_nobody() -> None:
    """`From: ann@example.com <mallory@example.com>`: a mail server (and its DKIM and SPF)
    takes the bracketed address, the standard library's parseaddr the first one. Mallory,
    signing as example.com, must not be taken for Ann."""
    genuine = "Authentication-Results: mx.example.test; dkim=pass header.d=example.com"
    for sender in (
        "ann@example.com <mallory@example.com>",
        "<ann@example.com> mallory@example.com",
        "ann@example.com, mallory@example.com",
    ):
        data = _with_results(genuine, MX_RECEIVED).replace(
            b"From: Ann <ann@example.com>", f"From: {sender}".encode()
        )
        mail = to_received(
            data,
            config=config(**STRICT),
            account=AccountId("default"),
            uidvalidity=7,
            uid=3,
            now=NOW,
        )
        assert mail.message.sender.id != "ann@example.com", sender
        assert mail.message.raw.get("refused"), sender
    # A display name holding an address (quoted or encoded) is only a name.
    for sender in (
        '"ann@example.com" <mallory@example.com>',
        "=?utf-8?q?ann=40example.com?= <mallory@example.com>",
    ):
        data = _with_results(genuine, MX_RECEIVED).replace(
            b"From: Ann <ann@example.com>", f"From: {sender}".encode()
        )
        mail = to_received(
            data,
            config=config(**STRICT),
            account=AccountId("default"),
            uidvalidity=7,
            uid=3,
            now=NOW,
        )
        assert mail.message.sender.id == "mallory@example.com", sender
