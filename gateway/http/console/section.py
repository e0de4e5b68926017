"""One section of the console: a nav entry and its routes (one module + templates each)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter


@dataclass(frozen=True, slots=True)
class Section:
    """A page of the console: `title` in the navigation, served at `/console/<slug>` (the
    overview at `/console`) by `router`, whose paths are relative to `/console`."""

    slug: str
    title: str
    router: APIRouter

    @property
    def path(self) -> str:
        """Where the section's page is."""
        return "/console" if self.slug == "overview" else f"/console/{self.slug}"
