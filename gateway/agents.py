"""The agents of the profiles, and which one answers a chat (the bindings of the config and
those `herald profiles bind` stored)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from agent_core.agent import Agent
from gateway.profiles import DEFAULT, Binding, choose
from gateway.store.profiles import StoredBindings

logger = logging.getLogger(__name__)


class UnknownProfile(LookupError):
    """No profile of that name is configured (the message lists those that are)."""


class ProfileAgents:
    """One agent per profile; `default` always among them."""

    def __init__(
        self,
        agents: Mapping[str, Agent],
        rules: Sequence[Binding] = (),
        stored: StoredBindings | None = None,
    ) -> None:
        if DEFAULT not in agents:
            raise ValueError("the default profile's agent is missing")
        self.agents = dict(agents)
        self.rules = tuple(rules)
        """The config's bindings."""
        self.stored = stored
        """Bindings stored by `herald profiles bind` (None: the config's alone)."""
        self._warned: set[Binding] = set()
        """Stored bindings naming no configured profile, already logged."""

    @classmethod
    def single(cls, agent: Agent) -> ProfileAgents:
        """Just the default profile (a plain config)."""
        return cls({DEFAULT: agent})

    @property
    def default(self) -> Agent:
        """The agent of the default profile (the top-level config)."""
        return self.agents[DEFAULT]

    @property
    def names(self) -> list[str]:
        """Every profile's name, `default` first."""
        return list(self.agents)

    def get(self, name: str) -> Agent:
        """The agent of profile `name`; UnknownProfile naming those there are."""
        agent = self.agents.get(name)
        if agent is None:
            raise UnknownProfile(f"no profile {name!r} (profiles: {', '.join(self.agents)})")
        return agent

    async def rules_now(self) -> list[Binding]:
        """The config's bindings and the stored ones (read now; none are read while the
        default profile is the only one)."""
        if self.stored is None or len(self.agents) == 1:
            return list(self.rules)
        return [*self.rules, *await self.stored.list()]

    async def choose(self, platform: str, account: str, chat: str, thread: str | None) -> Agent:
        """The agent that answers in this chat now (a stored binding naming a profile the
        config no longer has is skipped, and logged once)."""
        if len(self.agents) == 1:
            return self.default
        rules = []
        for rule in await self.rules_now():
            if rule.profile in self.agents:
                rules.append(rule)
            elif rule not in self._warned:  # said once per binding (each message reads them)
                self._warned.add(rule)
                options = " ".join(
                    f"--{k} {v}"
                    for k, v in zip(
                        ("platform", "account", "chat", "thread"), rule.where, strict=True
                    )
                    if v is not None
                )
                logger.warning(
                    "the stored binding %s names profile %r, which the config no longer has: "
                    "it is skipped (remove it: herald profiles unbind %s; profiles: %s)",
                    rule.describe(),
                    rule.profile,
                    options,
                    ", ".join(self.agents),
                )
        return self.agents[choose(rules, platform, account, chat, thread)]
