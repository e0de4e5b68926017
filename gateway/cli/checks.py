"""Live credential checks shared by `herald doctor` and `herald setup`: a platform's
account (each adapter's `check`, which takes nothing over), the model endpoint's
`/models`, and the speech endpoint (a few words spoken)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.checkpoints import MemoryCheckpoints
from gateway.contracts.adapter import SelfCheck
from gateway.contracts.errors import AuthError, HeraldError, LLMError, LLMRejected

if TYPE_CHECKING:
    from agent_core.config import LLMConfig
    from gateway.config import HeraldConfig
    from gateway.contracts.config import PlatformSection

# The model client and the daemon's wiring are imported by the checks themselves: every
# command of the CLI imports this module, and most never check anything.

PLATFORM_CHECK_TIMEOUT = 20.0

OK, WARN, FAIL, REFUSED = "ok", "warn", "fail", "refused"
"""Verdicts; REFUSED: the platform or endpoint said no to the credentials (a FAIL)."""


async def check_platform(name: str, section: PlatformSection, state_dir: Path) -> tuple[str, str]:
    """(verdict, detail) of a platform section's credentials, checked against the platform:
    OK with the account's description, REFUSED with the platform's reason, FAIL when it
    could not be asked."""
    from gateway.supervisor import adapter_context, adapter_factory  # noqa: PLC0415

    try:
        context = adapter_context(name, section, state_dir, MemoryCheckpoints())
        adapter = adapter_factory(name, section, context)()
    except HeraldError as err:
        return FAIL, str(err)
    if not isinstance(adapter, SelfCheck):
        return OK, "configured (no remote check available)"
    try:
        async with asyncio.timeout(PLATFORM_CHECK_TIMEOUT):
            detail = await adapter.check()
    except AuthError as err:
        return REFUSED, f"credentials refused: {err}"
    except TimeoutError:
        return FAIL, f"no answer within {PLATFORM_CHECK_TIMEOUT:g} s"
    except Exception as err:
        return FAIL, f"unreachable: {err}"
    return OK, detail


async def check_llm(config: LLMConfig) -> tuple[str, str]:
    """(verdict, detail) of the model endpoint: WARN for the offline echo provider or a
    model the endpoint does not list (some servers list none), REFUSED for a rejected key."""
    from agent_core.llm import NOT_LISTED, make_provider  # noqa: PLC0415

    provider = make_provider(config)
    try:
        detail = await provider.check()
    except LLMRejected as err:
        return REFUSED, str(err)
    except LLMError as err:
        return FAIL, str(err)
    finally:
        await provider.aclose()
    return (WARN if provider.name == "echo" or NOT_LISTED in detail else OK), detail


async def check_speech(config: HeraldConfig) -> tuple[str, str]:
    """(verdict, detail) of the `speech` endpoint: a few words spoken, checked to be Ogg/Opus
    (FAIL: refused, unreachable, or another format; the answers would all be text)."""
    from agent_core.media.speech import SpeechFailed  # noqa: PLC0415
    from gateway.media import synthesizer  # noqa: PLC0415

    speaker = synthesizer(config)
    if speaker is None:
        return WARN, "no speech.base_url: every answer is text"
    try:
        audio = await speaker.speak("Herald is ready.")
    except SpeechFailed as err:
        return FAIL, f"{config.speech.base_url}: {err}; answers will be text"
    finally:
        await speaker.aclose()
    speech = config.speech
    return OK, f"{speech.base_url}: {len(audio)} bytes of Ogg/Opus ({speech.model}, {speech.voice})"
