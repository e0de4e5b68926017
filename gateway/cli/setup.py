"""`herald setup`: a guided configuration in the terminal.

Choose a platform and paste its credentials; Herald checks them live (the same checks as
`herald doctor`) before anything is saved. Then who may talk to the agent, pairing, the
home channel and the model endpoint (checked through its `/models`). The YAML keeps its
comments and other keys; secrets go to files of their own (mode 0600). Every answer has a
flag, so `--non-interactive` runs are scripts; a run asks only what no flag answered, each
question defaulting to the current value, so a re-run changes one part and keeps the rest.
Ctrl-C (or a refusal) leaves every file as it was.
"""

from __future__ import annotations

import asyncio
import inspect
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Protocol

import typer
from pydantic import SecretStr, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.prompt import Confirm, Prompt

from agent_core.config import LLMConfig
from gateway import platforms
from gateway.cli.checks import OK, WARN, check_llm, check_platform
from gateway.cli.setup_file import ConfigFile
from gateway.config import config_path_from_env
from gateway.contracts.config import ACCOUNT_FORBIDDEN
from gateway.contracts.errors import ConfigError
from gateway.contracts.platform import AnySpec, SetupQuestion
from gateway.cron.targets import DEFAULT_ACCOUNT, home_problems

DEFAULT_FILE = Path("herald.yaml")
SKIP = "skip"
DEFAULT_MODEL = LLMConfig.model_fields["model"].default
EXIT_REFUSED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class Stop(Exception):
    """End the run without writing: `message` says why, `code` is the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Answers:
    """What the flags answered (None: not given)."""

    platform: str | None = None
    account: str | None = None
    """`--account`: the account of the platform to add or edit."""
    values: dict[str, str] = field(default_factory=dict)
    """Platform config keys → values (`--token`, `--set KEY=VALUE`, …)."""
    base_url: str | None = None
    allowed_users: str | None = None
    pairing: bool | None = None
    home: str | None = None
    llm_base_url: str | None = None
    llm_api_key: str | None = None
    model: str | None = None
    check: bool = True


class Asker(Protocol):
    """How a question missing from the flags is answered."""

    def text(self, prompt: str, default: str | None, *, secret: bool = False) -> str:
        """The answer; `default` when the person just presses Enter (secrets: kept)."""
        ...

    def confirm(self, prompt: str, default: bool) -> bool:
        """Yes or no."""
        ...


class TerminalAsker:
    """Questions in the terminal (rich prompts; secrets are not echoed)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def text(self, prompt: str, default: str | None, *, secret: bool = False) -> str:
        if secret:
            hint = " (Enter keeps the current one)" if default else ""
            answer = Prompt.ask(
                f"{escape(prompt)}{hint}",
                console=self.console,
                password=True,
                default="",
                show_default=False,
            )
            return answer.strip() or (default or "")
        answer = Prompt.ask(
            escape(prompt), console=self.console, default=default or "", show_default=bool(default)
        )
        return answer.strip()

    def confirm(self, prompt: str, default: bool) -> bool:
        return Confirm.ask(escape(prompt), console=self.console, default=default)


class ScriptAsker:
    """`--non-interactive`: a question without a flag takes its default, or stops the run."""

    def text(self, prompt: str, default: str | None, *, secret: bool = False) -> str:
        if default is None:
            raise Stop(f"no answer for {prompt!r}: give its flag", EXIT_BAD_INPUT)
        return default

    def confirm(self, prompt: str, default: bool) -> bool:
        return default


def questions(spec: AnySpec) -> tuple[SetupQuestion, ...]:
    """What setting `spec`'s platform up asks: its own questions, else its required keys."""
    if spec.setup:
        return spec.setup
    return tuple(
        SetupQuestion(name, name.replace("_", " "), secret=info.annotation is SecretStr)
        for name, info in spec.config.model_fields.items()
        if info.is_required()
    )


def choosable() -> list[str]:
    """The platforms a person can set up (not those for tests only)."""
    return [spec.name for spec in platforms.SPECS if not spec.internal]


class Setup:
    """One run of `herald setup` over a config file."""

    def __init__(
        self, file: ConfigFile, answers: Answers, asker: Asker, console: Console, *, live: bool
    ) -> None:
        self.file = file
        self.answers = answers
        self.asker = asker
        self.console = console
        self.live = live
        """Interactive: a refused credential is asked again instead of ending the run."""
        self.where: tuple[str, ...] = ()
        """The config path of the section being set up: `platforms.<name>`, or
        `platforms.<name>.accounts.<account>`."""

    def run(self) -> None:
        """Ask, check, and edit the file in memory (nothing is written here)."""
        name = self._platform()
        if name is not None:
            self.where = self._place(name)
            self._credentials(platforms.spec(name))
            self._access(name)
        self._home()
        self._model()

    # -- platform -----------------------------------------------------------------------

    def _platform(self) -> str | None:
        name = self.answers.platform
        if name is None:
            if not self.live:
                return None
            names = choosable()
            configured = [n for n in names if self.file.section("platforms", n)]
            self.console.print(
                f"Platforms: {', '.join(names)}"
                + (f" (configured: {', '.join(configured)})" if configured else "")
            )
            name = self.asker.text(
                f"Platform to set up ({SKIP} to leave them as they are)",
                SKIP if configured else None,
            ).lower()
            while name not in (*names, SKIP):
                self.console.print(f"[red]{escape(name)!r} is not one of {', '.join(names)}[/]")
                name = self.asker.text("Platform to set up", SKIP).lower()
        if name == SKIP:
            return None
        try:
            platforms.spec(name)
        except LookupError as err:
            raise Stop(str(err), EXIT_BAD_INPUT) from err
        return name

    def _place(self, name: str) -> tuple[str, ...]:
        """Where the account being set up goes. A platform written as one section stays so
        while it has one account; adding a second account (`--account`) moves the first
        under `accounts:` and adds the new one beside it."""
        account = self.answers.account
        entry = self.file.section("platforms", name)
        if "accounts" in entry:
            names = [str(n) for n in self.file.section("platforms", name, "accounts")]
            if account is None:
                if not self.live:
                    raise Stop(
                        f"platforms.{name} has accounts ({', '.join(names)}): name the one "
                        "to set up with --account",
                        EXIT_BAD_INPUT,
                    )
                account = self.asker.text(f"Account ({', '.join(names)}, or a new name)", None)
            _check_account(account)
            return ("platforms", name, "accounts", account)
        current = str(entry.get("account") or DEFAULT_ACCOUNT)
        if account is None or account == current:
            return ("platforms", name)
        _check_account(account)
        if not entry:
            self.file.set("platforms", name, "account", value=account)
            return ("platforms", name)
        self.file.to_accounts(name, current)
        self.console.print(
            f"platforms.{name} now has accounts: {current} (as it was) and {account} (new)."
        )
        return ("platforms", name, "accounts", account)

    def _credentials(self, spec: AnySpec) -> None:
        given = dict(self.answers.values)
        while True:
            values = self._ask_questions(spec, given)
            if self.answers.base_url is not None:
                if spec.base_url_key is None:
                    raise Stop(f"{spec.name} has no API base URL to set", EXIT_BAD_INPUT)
                values[spec.base_url_key] = self.answers.base_url
            problem = self._check(spec, values)
            if problem is None:
                break
            if not self.live:
                raise Stop(problem, EXIT_REFUSED)
            self.console.print(f"[red]✗[/] {escape(problem)}")
            self.console.print("Nothing is saved. Try again (Ctrl-C to stop).")
            given = {}
        for question in questions(spec):
            value = values.get(question.key)
            if value is None or value == "":
                continue
            if question.secret:
                # A kept secret stays where it is (inline, or a file of the person's own).
                if value != self.file.secret(*self.where, question.key):
                    self.file.set_secret(*self.where, question.key, value=value)
            else:
                self.file.set(*self.where, question.key, value=_typed(value, question))
        extra = {k: v for k, v in values.items() if k not in {q.key for q in questions(spec)}}
        for key, value in extra.items():
            self.file.set(*self.where, key, value=value)

    def _ask_questions(self, spec: AnySpec, given: Mapping[str, str]) -> dict[str, Any]:
        values: dict[str, Any] = {k: v for k, v in given.items()}
        for question in questions(spec):
            if question.key in values:
                continue
            if question.secret:
                current = self.file.secret(*self.where, question.key)
            else:
                found = self.file.get(*self.where, question.key)
                current = question.default if found is None else str(found)
            if not self.live and not current:
                flag = f"--{question.key.replace('_', '-')}"
                raise Stop(
                    f"{spec.name} needs {question.prompt!r}: give {flag} "
                    f"(or --set {question.key}=…)",
                    EXIT_BAD_INPUT,
                )
            answer = self.asker.text(question.prompt, current, secret=question.secret)
            while not answer:
                self.console.print(f"[red]{escape(question.prompt)} is needed[/]")
                answer = self.asker.text(question.prompt, current, secret=question.secret)
            values[question.key] = answer
        return values

    def _check(self, spec: AnySpec, values: Mapping[str, Any]) -> str | None:
        """Why the answers cannot be saved (invalid, or refused by the platform), or None."""
        shared = self.file.plain("platforms", spec.name)
        shared.pop("accounts", None)  # the keys beside `accounts` are every account's defaults
        data = {**shared, **self.file.plain(*self.where), **values}
        try:
            section = spec.config.model_validate(data)
        except ValidationError as err:
            reasons = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or spec.name}: "
                + e["msg"].removeprefix("Value error, ")
                for e in err.errors()
            )
            return f"{'.'.join(self.where)}: {reasons}"
        if not self.answers.check:
            return None
        self.console.print(f"Checking the {spec.name} credentials…")
        with tempfile.TemporaryDirectory(prefix="herald-setup-") as scratch:
            verdict, detail = asyncio.run(check_platform(spec.name, section, Path(scratch)))
        if verdict in (OK, WARN):
            self.console.print(f"[green]✓[/] {escape(spec.name)}: {escape(detail)}")
            return None
        return f"{spec.name}: {detail}"

    def _accounts(self) -> list[tuple[str, str]]:
        """The (platform, account) pairs the file sets up."""
        out: list[tuple[str, str]] = []
        for name in platforms.names():
            entry = self.file.section("platforms", name)
            if "accounts" in entry:
                out.extend((name, str(a)) for a in self.file.section("platforms", name, "accounts"))
            elif entry:
                out.append((name, str(entry.get("account") or DEFAULT_ACCOUNT)))
        return out

    def _access(self, name: str) -> None:
        current = self.file.get(*self.where, "allowed_users")
        shown = ", ".join(str(u) for u in current) if isinstance(current, list) else current
        users = self.answers.allowed_users
        if users is None:
            users = self.asker.text(
                "Who may talk to the agent: their user ids on this platform, comma-separated "
                "(* for anyone; empty for only the people you approve)",
                "" if shown is None else str(shown),
            )
        listed = [u.strip() for u in users.split(",") if u.strip()]
        self.file.set(*self.where, "allowed_users", value=listed or None)
        pairing = self.answers.pairing
        if pairing is None:
            now = self.file.get(*self.where, "pairing")
            default = (
                bool(now)
                if now is not None
                else bool(platforms.spec(name).config.model_fields["pairing"].default)
            )
            pairing = self.asker.confirm(
                "Send unknown people a pairing code for you to approve?", default
            )
        self.file.set(*self.where, "pairing", value=pairing)

    # -- home and model -----------------------------------------------------------------

    def _home(self) -> None:
        home = self.answers.home
        if home is None:
            current = self.file.get("home")
            if isinstance(current, Mapping):
                current = current.get("targets")
            shown = ", ".join(current) if isinstance(current, list) else current
            home = self.asker.text(
                f"Home channel for scheduled reports (like {platforms.example_target()}; "
                "empty for none)",
                "" if shown is None else str(shown),
            )
        targets = [t.strip() for t in home.split(",") if t.strip()]
        configured = self._accounts()
        while problems := home_problems(targets, configured):
            if not self.live:
                raise Stop("; ".join(problems), EXIT_BAD_INPUT)
            for problem in problems:
                self.console.print(f"[red]{escape(problem)}[/]")
            home = self.asker.text("Home channel for scheduled reports (empty for none)", "")
            targets = [t.strip() for t in home.split(",") if t.strip()]
        existing = self.file.get("home")
        if isinstance(existing, Mapping):
            self.file.set("home", "targets", value=targets or None)
        else:
            self.file.set("home", value=(targets[0] if len(targets) == 1 else targets) or None)

    def _model(self) -> None:
        a = self.answers
        given = a.llm_base_url is not None or a.llm_api_key is not None or a.model is not None
        if not given and not self.live:
            return
        given_values = (a.llm_base_url, a.llm_api_key, a.model)
        while True:
            base_url, api_key, model = self._ask_model(*given_values)
            config = self._llm_config(base_url, api_key, model)
            problem = self._check_model(config) if a.check and config is not None else None
            if problem is None:
                break
            if not self.live:
                raise Stop(problem, EXIT_REFUSED)
            self.console.print(f"[red]✗[/] {escape(problem)}")
            self.console.print("Nothing is saved. Try again (Ctrl-C to stop).")
            given_values = (None, None, None)
        self.file.set("llm", "base_url", value=base_url or None)
        if api_key and api_key != self.file.secret("llm", "api_key"):
            self.file.set_secret("llm", "api_key", value=api_key)
        self.file.set("llm", "model", value=model if model != DEFAULT_MODEL else None)
        if not self.file.section("llm"):
            self.file.set("llm", value=None)

    def _ask_model(
        self, base_url: str | None, api_key: str | None, model: str | None
    ) -> tuple[str, str, str]:
        current_url = self.file.get("llm", "base_url")
        if base_url is None:
            base_url = self.asker.text(
                "Model endpoint: an OpenAI-compatible base URL like https://api.openai.com/v1 "
                "(empty for the offline echo provider)",
                "" if current_url is None else str(current_url),
            )
        if api_key is None:
            current_key = self.file.secret("llm", "api_key")
            prompt = (
                "Its API key (empty if it needs none)"
                if base_url
                else "API key for OpenAI (empty for the offline echo provider)"
            )
            api_key = self.asker.text(prompt, current_key, secret=True)
        if model is None:
            current_model = self.file.get("llm", "model")
            model = (
                self.asker.text("Model name", str(current_model or DEFAULT_MODEL))
                if base_url or api_key
                else str(current_model or DEFAULT_MODEL)
            )
        return base_url, api_key or "", model or DEFAULT_MODEL

    @staticmethod
    def _llm_config(base_url: str, api_key: str, model: str) -> LLMConfig | None:
        if not base_url and not api_key:
            return None
        try:
            return LLMConfig(
                base_url=base_url or None,
                api_key=SecretStr(api_key) if api_key else None,
                model=model,
                max_retries=0,
                connect_timeout=5,
                request_timeout=20,
            )
        except ValidationError as err:
            raise Stop(f"llm: {err.errors()[0]['msg']}", EXIT_BAD_INPUT) from err

    def _check_model(self, config: LLMConfig) -> str | None:
        self.console.print("Checking the model endpoint…")
        verdict, detail = asyncio.run(check_llm(config))
        if verdict == OK:
            self.console.print(f"[green]✓[/] llm: {escape(detail)}")
            return None
        if verdict == WARN:
            self.console.print(f"[yellow]![/] llm: {escape(detail)}")
            return None
        return f"llm: {detail}"


def question_keys() -> dict[str, str]:
    """Every platform's setup questions by config key (each key a flag of `herald setup`),
    with the help its flag shows: the prompt, and which platforms ask it."""
    asked: dict[str, list[tuple[str, str]]] = {}
    for spec in platforms.SPECS:
        if spec.internal:
            continue
        for question in questions(spec):
            asked.setdefault(question.key, []).append((spec.name, question.prompt))
    return {
        key: "; ".join(f"{name}: {prompt}" for name, prompt in entries) + "."
        for key, entries in asked.items()
    }


def _with_question_flags(command: Callable[..., None]) -> Callable[..., None]:
    """`command` whose signature has one `--<key>` option per setup question of any platform,
    in place of its `**answered` (typer reads the signature), so a platform's questions reach
    the command line from its spec and `herald setup` names no platform."""
    signature = inspect.signature(command, eval_str=True)
    fixed = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in fixed}
    extra = [
        inspect.Parameter(
            key,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                str | None, typer.Option(f"--{key.replace('_', '-')}", help=help_text)
            ],
        )
        for key, help_text in question_keys().items()
        if key not in taken
    ]
    at = next(i for i, p in enumerate(fixed) if p.name == "base_url")
    params = [*fixed[:at], *extra, *fixed[at:]]
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
    command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return command


def _check_account(name: str) -> None:
    """An account name as config takes it (one path segment: no `:`, `/`, `\\`, `?`, `#`,
    `%` nor spaces, not `.` or `..`), or Stop."""
    bad = any(c in ACCOUNT_FORBIDDEN or c.isspace() for c in name) or name in (".", "..")
    if not name or bad or len(name) > 128:
        raise Stop(
            f"{name!r} is not an account name: a word of letters, digits, '-', '_' or '.', "
            "like 'work'",
            EXIT_BAD_INPUT,
        )


def _typed(value: str, question: SetupQuestion) -> Any:
    """A number where the question's default is one (ports), else the text."""
    if question.default is not None and question.default.isdigit() and value.isdigit():
        return int(value)
    return value


def _pairs(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--set")
        out[key.strip()] = value.strip()
    return out


@_with_question_flags
def setup(  # noqa: PLR0917 - one parameter per answer
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="The YAML file to write (default: $HERALD_CONFIG, else ./herald.yaml).",
        ),
    ] = None,
    non_interactive: Annotated[
        bool, typer.Option("--non-interactive", help="Ask nothing: flags give every answer.")
    ] = False,
    platform: Annotated[
        str | None,
        typer.Option(help=f"The platform to set up ({', '.join(choosable())}, or {SKIP})."),
    ] = None,
    account: Annotated[
        str | None,
        typer.Option(
            help="The account of the platform to add or edit (a second one moves the first "
            "under `accounts:`)."
        ),
    ] = None,
    base_url: Annotated[
        str | None, typer.Option(help="The platform's API base URL (a proxy, a local server).")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Any other key of the platform's section: KEY=VALUE."),
    ] = None,
    allowed_users: Annotated[
        str | None, typer.Option(help="Who may talk to the agent: ids, comma-separated.")
    ] = None,
    pairing: Annotated[
        bool | None, typer.Option("--pairing/--no-pairing", help="Pairing codes for strangers.")
    ] = None,
    home: Annotated[
        str | None, typer.Option(help="Home channel(s) for scheduled reports; '' for none.")
    ] = None,
    llm_base_url: Annotated[
        str | None, typer.Option(help="The model endpoint (OpenAI-compatible base URL).")
    ] = None,
    llm_api_key: Annotated[str | None, typer.Option(help="The model endpoint's key.")] = None,
    model: Annotated[str | None, typer.Option(help="The model name.")] = None,
    secrets_dir: Annotated[
        Path | None, typer.Option(help="Where secret files go (default: secrets/ beside it).")
    ] = None,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Check credentials live before saving.")
    ] = True,
    **answered: str | None,
) -> None:
    """Set Herald up: a platform (credentials checked live), access, home, model.

    Edits an existing file in place, keeping its comments; `--non-interactive` takes every
    answer from the flags."""
    console = Console(highlight=False, soft_wrap=True)
    path = config_path_from_env(config) or DEFAULT_FILE
    named = {key: answered.get(key) for key in question_keys()}
    answers = Answers(
        platform=None if platform is None else platform.strip().lower(),
        account=None if account is None else account.strip(),
        values={**{k: v for k, v in named.items() if v is not None}, **_pairs(set_ or [])},
        base_url=base_url,
        allowed_users=allowed_users,
        pairing=pairing,
        home=home,
        llm_base_url=llm_base_url,
        llm_api_key=llm_api_key,
        model=model,
        check=check,
    )
    try:
        file = ConfigFile(path, secrets_dir)
        if not non_interactive:
            what = "Editing" if file.existed else "Creating"
            console.print(
                f"{what} [bold]{escape(str(path))}[/] (Ctrl-C stops; nothing is "
                "written until the end)."
            )
        asker: Asker = ScriptAsker() if non_interactive else TerminalAsker(console)
        Setup(file, answers, asker, console, live=not non_interactive).run()
        file.validate()
        if not non_interactive and not asker.confirm(f"Write {path}?", True):
            raise Stop("nothing was written", EXIT_REFUSED)
        file.commit()
    except KeyboardInterrupt:
        console.print("\nStopped: nothing was written.")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except EOFError:
        Console(stderr=True).print(
            "[red]error:[/] the input ended before every question was answered; nothing was "
            "written (without a terminal, use --non-interactive and the flags)"
        )
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except Stop as err:
        Console(stderr=True).print(f"[red]error:[/] {escape(str(err))}; nothing was written")
        raise typer.Exit(err.code) from err
    except ConfigError as err:
        Console(stderr=True).print(f"[red]error:[/] {escape(str(err))}\nnothing was written")
        raise typer.Exit(EXIT_BAD_INPUT) from err
    where = f" (secrets in {escape(str(file.secrets_dir))}, mode 0600)" if file.secrets else ""
    console.print(f"[green]Wrote {escape(str(path))}[/]{where}.")
    console.print(f"Start Herald: herald run --config {escape(str(path))}")
