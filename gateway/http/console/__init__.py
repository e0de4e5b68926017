"""The operator's web console at `/console`: server-rendered pages (Jinja2, autoescaped),
a live overview over server-sent events, and a few actions behind CSRF-checked forms.

A section is one module in `sections/` (a `Section` with its router) and its templates;
`SECTIONS` lists them in navigation order.
"""

from __future__ import annotations

from gateway.http.console.section import Section
from gateway.http.console.sections import (
    access,
    deliveries,
    jobs,
    overview,
    sessions,
    skills,
    tools,
    triggers,
)

SECTIONS: tuple[Section, ...] = (
    overview.SECTION,
    sessions.SECTION,
    deliveries.SECTION,
    jobs.SECTION,
    triggers.SECTION,
    access.SECTION,
    skills.SECTION,
    tools.SECTION,
)
"""The console's pages, in navigation order."""
