"""Jittered exponential backoff, for reconnects and delivery retries."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Jittered exponential backoff: `initial * factor**n`, capped, times a random 0.5-1.0."""

    initial: float = 1.0
    factor: float = 2.0
    maximum: float = 300.0

    def delay(self, attempt: int) -> float:
        """The wait before retry number `attempt` (0-based)."""
        base = min(self.maximum, self.initial * self.factor ** min(attempt, 32))
        return base * random.uniform(0.5, 1.0)
