"""deploy/systemd/herald.service: the settings the daemon relies on, and systemd's own verdict."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway.config import HeraldConfig, PlatformAccounts, SessionsConfig, load_config
from tests.services import require_service

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
UNIT_PATH = DEPLOY / "herald.service"
ENV_EXAMPLE_PATH = DEPLOY / "herald.env.example"
SYSTEMD_PACKAGE = "systemd"  # the Debian package that ships /usr/bin/systemd-analyze

Unit = dict[str, list[tuple[str, str]]]


def parse_unit(text: str) -> Unit:
    """Sections of a unit file as ordered (key, value) assignments, repeated keys kept."""
    sections: Unit = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a KEY=VALUE line: {raw!r}"
        assert current is not None, f"assignment before any section: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: Unit, section: str, key: str) -> list[str]:
    """Every assignment of `key` in `section`, in order."""
    return [v for k, v in unit.get(section, []) if k == key]


def value(unit: Unit, section: str, key: str) -> str:
    """The effective (last) assignment of a single-valued key; fails when absent."""
    found = values(unit, section, key)
    assert found, f"[{section}] {key}= is missing"
    return found[-1]


def seconds(text: str) -> float:
    """A systemd time span given in plain seconds (`45` or `45s`)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)s?", text)
    assert match, f"{text!r} is not a plain number of seconds"
    return float(match[1])


@pytest.fixture(scope="module")
def unit() -> Unit:
    return parse_unit(UNIT_PATH.read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("WatchdogSec", "30"),
        ("Restart", "on-failure"),
        ("RestartSec", "5"),
        ("RestartPreventExitStatus", "2"),
        ("LimitNOFILE", "65536"),
        ("TimeoutStopSec", "45"),
        ("KillSignal", "SIGTERM"),
        ("StateDirectory", "herald"),
        ("EnvironmentFile", "-/etc/herald/herald.env"),
        ("User", "herald"),
        ("UMask", "0077"),
    ],
)
def test_service_lifecycle(unit: Unit, key: str, expected: str) -> None:
    assert value(unit, "Service", key) == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("ProtectClock", "yes"),
        ("ProtectHostname", "yes"),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        ("RestrictNamespaces", "yes"),
        ("RestrictRealtime", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("SystemCallArchitectures", "native"),
        ("SystemCallFilter", "@system-service"),
        ("CapabilityBoundingSet", ""),
    ],
)
def test_service_hardening(unit: Unit, key: str, expected: str) -> None:
    assert value(unit, "Service", key) == expected


def test_exec_start_runs_herald_directly(unit: Unit) -> None:
    # NotifyAccess=main only accepts datagrams from the main pid: no shell in between.
    argv = shlex.split(value(unit, "Service", "ExecStart"))

    assert argv == ["/opt/herald/.venv/bin/herald", "run", "--config", "/etc/herald/herald.yaml"]


def test_state_directory_is_home_and_writable(unit: Unit) -> None:
    assert "HERALD_HOME=%S/herald" in values(unit, "Service", "Environment")
    assert "%S/herald" in value(unit, "Service", "ReadWritePaths").split()


def test_stop_timeout_outlasts_the_drain(unit: Unit) -> None:
    stop_timeout = seconds(value(unit, "Service", "TimeoutStopSec"))

    assert stop_timeout >= SessionsConfig().drain_timeout + 15


def test_load_credential_is_documented() -> None:
    text = UNIT_PATH.read_text(encoding="utf-8")

    assert re.search(r"^# LoadCredential=llm_api_key:\S+$", text, re.MULTILINE)
    assert "# Environment=HERALD_LLM__API_KEY_FILE=%d/llm_api_key" in text


def test_installed_for_multi_user(unit: Unit) -> None:
    assert value(unit, "Install", "WantedBy") == "multi-user.target"


def env_example_names() -> list[str]:
    """The HERALD_* variables herald.env.example shows, commented out or not."""
    text = ENV_EXAMPLE_PATH.read_text(encoding="utf-8")
    return re.findall(r"^#?\s*(HERALD_[A-Z0-9_]+)=", text, re.MULTILINE)


def test_env_example_shows_variables() -> None:
    assert "HERALD_LLM__API_KEY_FILE" in env_example_names()


@pytest.mark.parametrize("name", env_example_names())
def test_env_example_names_a_real_setting(name: str) -> None:
    *sections, key = name.removeprefix("HERALD_").lower().split("__")
    model: type[BaseModel] = HeraldConfig
    for section in sections:
        assert section in model.model_fields, f"{name}: no section {section!r}"
        annotation = model.model_fields[section].annotation
        # An optional section (`TelegramConfig | None`) names its model among its arguments.
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = options[0] if len(options) == 1 else annotation
        assert isinstance(annotation, type)
        assert issubclass(annotation, BaseModel), f"{name}: {section!r} is not a section"
        model = annotation
        if issubclass(model, PlatformAccounts):  # one section, or several `accounts`
            [model] = [
                a
                for a in typing.get_args(model.model_fields["accounts"].annotation)
                if isinstance(a, type) and issubclass(a, BaseModel)
            ]

    assert key in model.model_fields or (
        key.endswith("_file") and key.removesuffix("_file") in model.model_fields
    ), f"{name}: no setting {key!r}"


def test_unit_environment_is_accepted_by_the_config(
    unit: Unit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.upper().startswith("HERALD_")]:
        monkeypatch.delenv(name)
    for assignment in values(unit, "Service", "Environment"):
        for pair in shlex.split(assignment):
            name, _, setting = pair.partition("=")
            monkeypatch.setenv(name, setting.replace("%S", str(tmp_path)))

    assert load_config(None).state_dir == tmp_path / "herald"


@pytest.fixture
def systemd_analyze() -> str:
    """The systemd-analyze binary; skips without it unless HERALD_REQUIRE_SERVICES=1."""
    found = shutil.which("systemd-analyze")
    if found is None:
        message = (
            "systemd-analyze is not installed "
            f"(Debian package {SYSTEMD_PACKAGE!r}: apt-get install -y {SYSTEMD_PACKAGE})"
        )
        if os.environ.get("HERALD_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


def runnable_copy(directory: Path) -> Path:
    """The unit copied into `directory` with ExecStart's program replaced by one that exists."""
    text = UNIT_PATH.read_text(encoding="utf-8")
    program = shutil.which("true") or "/bin/true"
    copy = directory / UNIT_PATH.name
    copy.write_text(
        text.replace("ExecStart=/opt/herald/.venv/bin/herald ", f"ExecStart={program} "),
        encoding="utf-8",
    )
    assert copy.read_text(encoding="utf-8") != text
    return copy


def run_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": ""},
    )


def test_systemd_analyze_verify(systemd_analyze: str, tmp_path: Path) -> None:
    copy = runnable_copy(tmp_path)

    result = run_analyze(systemd_analyze, "verify", str(copy))

    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # Unknown keys and bad values are only warnings ("herald.service:12: Unknown key ...").
    assert UNIT_PATH.name not in output, output


def test_systemd_analyze_security_exposure(systemd_analyze: str, tmp_path: Path) -> None:
    version = run_analyze(systemd_analyze, "--version").stdout
    match = re.match(r"systemd (\d+)", version)
    if match is None or int(match[1]) < 250:
        require_service("systemd >= 250 (`security --offline`)", f"found {version[:40]!r}")
    copy = runnable_copy(tmp_path)

    # Exposure is 0.0 (locked down) .. 10.0 (unsafe); the threshold is given in tenths.
    result = run_analyze(
        systemd_analyze, "security", "--offline=yes", "--threshold=20", "--no-pager", str(copy)
    )

    assert result.returncode == 0, result.stdout + result.stderr


TEMPLATE_PATH = DEPLOY / "herald@.service"


def test_the_instance_template_is_the_service_plus_an_instance_id() -> None:
    """herald@.service keeps every setting of herald.service (hardening, drain, watchdog) and
    adds only what makes each instance its own."""
    single = parse_unit(UNIT_PATH.read_text(encoding="utf-8"))
    template = parse_unit(TEMPLATE_PATH.read_text(encoding="utf-8"))
    assert values(template, "Service", "Environment")[-1] == "HERALD_INSTANCE_ID=%H-%i"
    assert values(template, "Service", "EnvironmentFile")[-1] == "-/etc/herald/herald-%i.env"
    added = {
        ("Environment", "HERALD_INSTANCE_ID=%H-%i"),
        ("EnvironmentFile", "-/etc/herald/herald-%i.env"),
    }
    assert [a for a in template["Service"] if a not in added] == single["Service"]
    assert template["Install"] == single["Install"]
    assert value(template, "Unit", "Description").endswith("(instance %i)")


def test_systemd_analyze_verify_the_instance_template(systemd_analyze: str, tmp_path: Path) -> None:
    program = shutil.which("true") or "/bin/true"
    text = TEMPLATE_PATH.read_text(encoding="utf-8")
    copy = tmp_path / "herald@a.service"
    copy.write_text(
        text.replace("ExecStart=/opt/herald/.venv/bin/herald ", f"ExecStart={program} "),
        encoding="utf-8",
    )
    result = run_analyze(systemd_analyze, "verify", str(copy))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "herald@" not in output, output
