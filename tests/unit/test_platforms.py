"""The platform registry: every adapter package's spec, and specs from entry points."""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from adapters.loopback.config import LoopbackConfig
from adapters.telegram.config import TelegramConfig
from gateway import platforms
from gateway.checkpoints import MemoryCheckpoints
from gateway.config import HeraldConfig
from gateway.contracts.adapter import Adapter, AdapterContext
from gateway.contracts.config import PlatformSection
from gateway.contracts.platform import PlatformSpec
from gateway.cron.targets import Address, parse_target

pytestmark = pytest.mark.timeout(30)


class PigeonConfig(PlatformSection):
    """A third-party platform's section."""

    loft: str = "home"


def _pigeon_factory(section: PigeonConfig, context: AdapterContext) -> Callable[[], Adapter]:
    raise AssertionError("not built in these tests")


PIGEON = PlatformSpec(
    name="pigeon", config=PigeonConfig, factory=_pigeon_factory, example="pigeon:1"
)
NOT_A_SPEC = object()
TAKES_SMS = PlatformSpec(
    name="pager",
    config=PigeonConfig,
    factory=_pigeon_factory,
    example="sms:1",
    aliases=("sms",),
)


def point(name: str, target: str) -> EntryPoint:
    return EntryPoint(name=name, value=f"{__name__}:{target}", group=platforms.ENTRY_POINT_GROUP)


def test_each_adapter_package_registers_one_spec() -> None:
    assert platforms.names() == (
        "test",
        "telegram",
        "slack",
        "twilio",
        "discord",
        "email",
        "matrix",
        "mattermost",
        "signal",
    )
    prefixes = platforms.target_prefixes()
    assert len(prefixes) == len(set(prefixes))
    for spec in platforms.SPECS:
        assert issubclass(spec.config, PlatformSection)
        assert platforms.spec(spec.name) is spec
        assert platforms.by_target_prefix(spec.name) is spec
        parsed = parse_target(spec.example)
        assert isinstance(parsed, Address)
        assert parsed.platform == spec.name


def test_only_the_test_platform_is_internal() -> None:
    assert [spec.name for spec in platforms.SPECS if spec.internal] == ["test"]
    assert platforms.example_target() == "telegram:123"


def test_an_unknown_platform_is_a_lookup_error() -> None:
    with pytest.raises(LookupError, match="no platform is named 'pigeon'"):
        platforms.spec("pigeon")
    assert platforms.by_target_prefix("pigeon") is None


def test_aliases_name_their_platform() -> None:
    assert platforms.by_target_prefix("sms") is platforms.spec("twilio")
    assert platforms.by_target_prefix("whatsapp") is platforms.spec("twilio")
    assert platforms.target_prefixes()[-2:] == ("sms", "whatsapp")


def test_the_config_has_one_section_per_platform() -> None:
    fields = type(HeraldConfig().platforms).model_fields
    assert tuple(fields) == platforms.names()
    config = HeraldConfig.model_validate({"platforms": {"telegram": {"token": "1:x"}}})
    assert isinstance(config.platforms.section(TelegramConfig), TelegramConfig)
    assert config.platforms.section(LoopbackConfig) is None
    assert list(config.platforms.accounts()) == [("telegram", "default")]


def test_a_spec_builds_only_its_own_section(tmp_path: Path) -> None:
    context = AdapterContext(tmp_path, MemoryCheckpoints())
    telegram = platforms.spec("telegram")
    with pytest.raises(TypeError, match=r"platforms\.telegram needs a TelegramConfig"):
        telegram.build(LoopbackConfig(url="http://127.0.0.1:9", token="t"), context)
    assert callable(telegram.build(TelegramConfig(token="1:x"), context))


def test_entry_points_add_platforms_after_the_built_in_ones() -> None:
    specs = platforms.load([point("pigeon", "PIGEON")])
    assert specs[: len(platforms.BUILT_IN)] == platforms.BUILT_IN
    assert specs[-1] is PIGEON


@pytest.mark.parametrize(
    ("entry", "logged"),
    [
        pytest.param(point("broken", "MISSING"), "is left out", id="fails-to-load"),
        pytest.param(point("odd", "NOT_A_SPEC"), "is not a PlatformSpec", id="not-a-spec"),
        pytest.param(point("again", "PIGEON"), "already registered", id="name-taken"),
    ],
)
def test_a_bad_entry_point_is_left_out_with_a_warning(
    entry: EntryPoint, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    found = [point("pigeon", "PIGEON"), entry]
    with caplog.at_level(logging.WARNING, logger="gateway.platforms"):
        specs = platforms.load(found)
    assert specs == (*platforms.BUILT_IN, PIGEON)
    assert logged in caplog.text


def test_a_built_in_name_or_alias_cannot_be_taken_by_an_entry_point() -> None:
    assert platforms.load([]) == platforms.BUILT_IN
    assert platforms.load([point("taken", "TAKES_SMS")]) == platforms.BUILT_IN
