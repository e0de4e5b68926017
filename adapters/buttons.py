"""What every adapter with buttons shares: which commands a press of Herald's buttons may send."""

from __future__ import annotations

import re

BUTTON_COMMAND = re.compile(r"^/(approve|deny) \d{1,18}$")
"""What a button of Herald's may send (`Button.command`); any other press is ignored."""


def button_command(value: object) -> str | None:
    """The command a pressed button carries, None when it is not one of Herald's."""
    if isinstance(value, str) and BUTTON_COMMAND.match(value):
        return value
    return None
