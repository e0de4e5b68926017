"""The console in a real browser: Playwright drives Debian's `chromium` (/usr/bin/chromium,
installed by .ci/run; no browser is downloaded) against the whole daemon in-process, its HTTP
server on 127.0.0.1, the loopback platform on its fake chat server and the fake LLM.

The browser's requests carry `X-Forwarded-For`, so the console treats it as a visitor from
elsewhere (as behind a reverse proxy): it must log in with the API key. Each page is
screenshotted into tests/artifacts/console/ (not committed).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect

from gateway.access import Pairings
from gateway.store.outbox import Outbox, OutboxStatus
from tests.e2e.daemon import free_port
from tests.fakes.chat_server import FakeChatServer
from tests.fakes.llm import FakeLLM
from tests.integration.inproc import Herald, running_daemon
from tests.services import require_service

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHROMIUM = "/usr/bin/chromium"
TOKEN = "4242:console-secret"
KEY = "console-browser-key"
ALLOWED = ["u-ann", "u-bob", "u-cat"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "console"
REMOTE = {"X-Forwarded-For": "203.0.113.7"}
WAIT = 15.0


@dataclass
class Rig:
    herald: Herald
    chat: FakeChatServer
    api: httpx.AsyncClient


def section(chat: FakeChatServer) -> dict[str, Any]:
    return {
        "url": chat.base_url,
        "token": TOKEN,
        "account": "bot1",
        "allowed_users": ALLOWED,
        "stream_edits": False,
        "poll_timeout": 1,
    }


EXTRA = {"cron": {"poll_interval": 0.1}, "console": {"live_interval": 0.2}}


@contextlib.asynccontextmanager
async def daemon(tmp: Path, *, drain_timeout: float = 2) -> AsyncIterator[Rig]:
    port = free_port()
    extra = {
        **EXTRA,
        "api": {"host": "127.0.0.1", "port": port, "key": KEY},
        "sessions": {"drain_timeout": drain_timeout, "ack_interval": 0},
    }
    async with (
        FakeLLM() as llm,
        FakeChatServer(TOKEN) as chat,
        running_daemon(tmp, llm, "test", section(chat), port=port, extra=extra) as herald,
        httpx.AsyncClient(
            base_url=herald.url,
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=10.0,
            trust_env=False,
        ) as api,
    ):
        yield Rig(herald, chat, api)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    """One headless chromium for the whole module."""
    if shutil.which(CHROMIUM) is None:
        require_service(f"Debian's chromium at {CHROMIUM}", "not installed (see .ci/run)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as playwright:
        # As root (CI) chromium's sandbox cannot start; the pages are our own.
        found = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield found
        finally:
            await found.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    """One daemon for the module's tests (each uses chats of its own)."""
    async with daemon(tmp_path_factory.mktemp("console")) as found:
        yield found


@contextlib.asynccontextmanager
async def visitor(browser: Browser, *, width: int = 1200) -> AsyncIterator[BrowserContext]:
    """A browser profile that reaches the console from elsewhere (through a proxy)."""
    context = await browser.new_context(
        extra_http_headers=REMOTE, viewport={"width": width, "height": 900}
    )
    context.set_default_timeout(WAIT * 1000)
    try:
        yield context
    finally:
        await context.close()


async def logged_in(context: BrowserContext, url: str, path: str = "/console") -> Page:
    """A page of `context` at `path`, after logging in with the key."""
    page = await context.new_page()
    await page.goto(f"{url}{path}")
    await expect(page.locator("h1")).to_have_text("Log in")
    await page.fill("#key", KEY)
    await page.click("form.login button")
    await page.wait_for_url(f"{url}{path}")
    return page


async def shot(page: Page, name: str) -> None:
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


async def until(check: Callable[[], Awaitable[Any]], timeout: float = WAIT) -> Any:
    async with asyncio.timeout(timeout):
        while not (result := await check()):
            await asyncio.sleep(0.05)
    return result


async def test_nothing_is_reachable_without_the_key_off_loopback(
    browser: Browser, rig: Rig
) -> None:
    url = rig.herald.url
    async with visitor(browser) as context:
        page = await context.new_page()
        await page.goto(f"{url}/console/deliveries")
        assert page.url.startswith(f"{url}/console/login?next=")
        await expect(page.locator("h1")).to_have_text("Log in")
        assert KEY not in page.url
        for path in ("/console/events", "/console/sessions", "/console/access"):
            answer = await context.request.get(f"{url}{path}", max_redirects=0)
            assert answer.status in (303, 401), path
        await shot(page, "login")
        await page.fill("#key", "not-the-key")
        await page.click("form.login button")
        await expect(page.locator(".error")).to_contain_text("not the API key")
        await page.fill("#key", KEY)
        await page.click("form.login button")
        await page.wait_for_url(f"{url}/console/deliveries")
        await expect(page.locator("h1")).to_have_text("Deliveries")
        cookies = {c["name"]: c for c in await context.cookies()}
        session = cookies["herald_console"]
        assert session["httpOnly"]
        assert session["sameSite"] == "Strict"
        assert KEY not in session["value"]


async def test_a_message_arrives_live_and_markup_is_shown_as_text(
    browser: Browser, rig: Rig
) -> None:
    url = rig.herald.url
    async with visitor(browser) as context:
        page = await logged_in(context, url)
        dialogs: list[str] = []
        page.on("dialog", lambda d: dialogs.append(d.message))
        await expect(page.locator("body")).to_have_attribute("data-live", "on")
        evil = "<script>window.pwned = 1; alert('pwned')</script> hello live"
        rig.chat.inject("c-ann", evil, sender_id="u-ann", sender_name="Ann <b>Admin</b>")
        recent = page.locator("#recent li").filter(has_text="hello live").first
        await expect(recent.locator(".text")).to_have_text(evil)
        await expect(recent.locator(".meta")).to_contain_text("Ann <b>Admin</b>")
        await expect(recent.locator(".outcome")).to_have_text("answered")
        assert await page.evaluate("() => window.pwned") is None
        assert await page.locator("#recent script").count() == 0
        assert dialogs == []
        await shot(page, "overview")
        await recent.locator("a").click()
        await expect(page.locator("h1")).to_contain_text("test:bot1:c-ann")
        await expect(page.locator(".transcript")).to_contain_text("You said:")
        assert await page.evaluate("() => window.pwned") is None
        await shot(page, "session")
        await page.goto(f"{url}/console/sessions?q=hello")
        await expect(page.locator("ul.messages")).to_contain_text("test:bot1:c-ann")
        await shot(page, "sessions-search")
        await page.goto(f"{url}/console/sessions")
        await shot(page, "sessions")


async def test_a_dead_letter_is_retried(browser: Browser, rig: Rig) -> None:
    url = rig.herald.url
    outbox = Outbox(rig.herald.store)
    rig.chat.block_chat("c-bob")
    rig.chat.inject("c-bob", "are you there?", sender_id="u-bob", sender_name="Bob")

    async def dead() -> list[Any]:
        return [
            r for r in await outbox.list(status=OutboxStatus.DEAD) if r.target.chat_id == "c-bob"
        ]

    [letter] = await until(dead)
    rig.chat.block_chat("c-bob", blocked=False)
    async with visitor(browser) as context:
        page = await logged_in(context, url, "/console/deliveries")
        row = page.locator(f"#dead-{letter.id}")
        await expect(row).to_contain_text("blocked")
        await shot(page, "deliveries")
        await row.get_by_role("button", name="Retry").click()
        await expect(page.locator(".notice")).to_have_text(f"Delivery {letter.id} is queued again.")
        await expect(page.locator(f"#dead-{letter.id}")).to_have_count(0)
    [sent] = await rig.chat.wait_for_sent(lambda s: s.chat_id == "c-bob", WAIT)
    assert "are you there?" in sent.text


async def test_a_pairing_is_approved(browser: Browser, rig: Rig) -> None:
    url = rig.herald.url
    rig.chat.inject("c-dee", "let me in", sender_id="u-dee", sender_name="Dee")
    [pairing] = await until(lambda: Pairings(rig.herald.store).list())
    async with visitor(browser) as context:
        page = await logged_in(context, url, "/console/access")
        row = page.locator(f"#pairing-{pairing.code}")
        await expect(row).to_contain_text("test:u-dee")
        await shot(page, "access")
        await row.get_by_role("button", name="Approve").click()
        await expect(page.locator(".notice")).to_contain_text(f"Pairing {pairing.code} is approved")
    await rig.chat.wait_for_sent(
        lambda s: s.chat_id == "c-dee" and "You now have access" in s.text, WAIT
    )
    rig.chat.inject("c-dee", "thanks", sender_id="u-dee", sender_name="Dee")
    await rig.chat.wait_for_sent(lambda s: s.chat_id == "c-dee" and "thanks" in s.text, WAIT)


async def test_a_job_is_run_now(browser: Browser, rig: Rig) -> None:
    url = rig.herald.url
    created = await rig.api.post(
        "/api/jobs",
        json={
            "name": "morning digest",
            "prompt": "summarise the night",
            "schedule": "0 7 * * *",
            "targets": ["test:c-cat"],
        },
    )
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    async with visitor(browser) as context:
        page = await logged_in(context, url, "/console/jobs")
        await shot(page, "jobs")
        await page.get_by_role("link", name="morning digest").click()
        await page.get_by_role("button", name="Run now").click()
        await expect(page.locator(".notice")).to_contain_text(f"Job {job_id} is queued")
        await rig.chat.wait_for_sent(lambda s: s.chat_id == "c-cat", WAIT)

        async def output_shown() -> bool:
            await page.reload()
            return await page.locator("#runs .output").filter(has_text="You said:").count() > 0

        await until(output_shown)
        await shot(page, "job")
        await page.get_by_role("button", name="Pause").click()
        await expect(page.locator(".notice")).to_contain_text("is paused")
        await page.get_by_role("button", name="Resume").click()
        await expect(page.locator(".notice")).to_contain_text("runs on its schedule again")


async def test_the_skills_and_tools_pages(browser: Browser, rig: Rig) -> None:
    url = rig.herald.url
    async with visitor(browser) as context:
        page = await logged_in(context, url, "/console/skills")
        await expect(page.locator("#shared-skills")).to_contain_text("bundled")
        await shot(page, "skills")
        await page.get_by_role("link", name="Tools").click()
        await expect(page.locator("#built-in")).to_contain_text("send_message")
        await shot(page, "tools")


async def test_a_form_post_without_the_csrf_token_is_refused(browser: Browser, rig: Rig) -> None:
    url = rig.herald.url
    async with visitor(browser) as context:
        page = await logged_in(context, url, "/console/deliveries")
        # As a form of the console's own page would be sent (Origin checked), but no token.
        answer = await context.request.post(
            f"{url}/console/deliveries/1/retry", form={}, headers={"Origin": url}
        )
        assert answer.status == 403
        assert "security token" in await answer.text()
        await page.goto(f"{url}/console")


async def test_the_charts_draw_the_traffic_and_switch_to_a_day(browser: Browser, rig: Rig) -> None:
    url = rig.herald.url
    for chat, user in (("c-chart-ann", "u-ann"), ("c-chart-bob", "u-bob")):
        rig.chat.inject(chat, f"chart me, {user}", sender_id=user)
    body = {"model": "herald", "messages": [{"role": "user", "content": "chart me too"}]}
    answer = await rig.api.post("/v1/chat/completions", json={**body, "user": "charted"})
    assert answer.status_code == 200
    await until(lambda: _answered(rig, "c-chart-ann", "c-chart-bob"))
    async with visitor(browser) as context:
        page = await logged_in(context, url)
        refused: list[str] = []
        page.on(
            "console", lambda m: refused.append(m.text) if "Content Security" in m.text else None
        )
        await expect(page.locator("#charts")).to_have_attribute("data-window", "hour")
        for chart in ("chart-in", "chart-out", "chart-reply", "chart-model", "chart-failures"):
            await expect(page.locator(f"#{chart} svg")).to_be_visible()
        incoming = page.locator("#chart-in")
        assert await incoming.locator("rect.bar").count() >= 2  # the test platform's and the API's
        await expect(incoming.locator(".legend")).to_contain_text("api")
        await expect(incoming.locator(".legend")).to_contain_text("test")
        # Measured in one step in the page (the live overview replaces the element now and
        # then, and a fresh one may not be laid out yet): the chart is drawn at a readable size.
        svg = incoming.locator("svg")
        size = "e => [e.getBoundingClientRect().width, e.getBoundingClientRect().height]"

        async def readable() -> bool:
            width, height = await svg.evaluate(size)
            return bool(width > 200 and height > 40)

        await until(readable)

        # A bar is filled by the stylesheet's colour (not the default black of an unstyled SVG).
        # (Read until laid out: an element the live overview just swapped in has no style yet.)
        async def styled() -> bool:
            bar = incoming.locator("rect.bar").first
            fill = await bar.evaluate("e => getComputedStyle(e).fill")
            return fill not in ("rgb(0, 0, 0)", "none", "")

        await until(styled)
        await expect(page.locator("#chart-reply .summary")).to_contain_text("answers timed: p50")
        await expect(page.locator("#per-platform")).to_contain_text("api")
        await shot(page, "overview-charts")
        await page.click("#charts .window a")
        await page.wait_for_url(f"{url}/console?window=day")
        await expect(page.locator("#charts")).to_have_attribute("data-window", "day")
        await expect(page.locator("body")).to_have_attribute("data-live", "on")
        await expect(page.locator("#chart-in .summary")).to_contain_text("in the last day")
        assert refused == []


async def _answered(rig: Rig, *chats: str) -> bool:
    return all(rig.chat.texts_in(chat) for chat in chats)


async def test_the_overview_reads_on_a_phone(browser: Browser, rig: Rig) -> None:
    async with visitor(browser) as context:  # after the other tests: something to show
        page = await logged_in(context, rig.herald.url)
        await expect(page.locator("body")).to_have_attribute("data-live", "on")
        await shot(page, "overview-busy")
    async with visitor(browser, width=390) as context:
        page = await logged_in(context, rig.herald.url)
        await expect(page.locator("body")).to_have_attribute("data-live", "on")
        width = await page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 390
        await shot(page, "overview-phone")


async def test_an_open_live_overview_does_not_hold_up_the_drain(
    browser: Browser, tmp_path: Path
) -> None:
    async with daemon(tmp_path, drain_timeout=40) as rig, visitor(browser) as context:
        page = await logged_in(context, rig.herald.url)
        await expect(page.locator("body")).to_have_attribute("data-live", "on")
        started = time.monotonic()
        rig.herald.supervisor.stop()
        await expect(page.locator("body")).to_have_attribute("data-live", "off", timeout=60_000)
    # Were the stream left open, the HTTP server would wait `drain_timeout + 5` = 45 s for it
    # before closing it; a closed stream ends within a few seconds even on a stalled machine.
    assert time.monotonic() - started < 45 / 2
