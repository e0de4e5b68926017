"""Herald: an always-on messaging gateway daemon for an LLM agent."""

__version__ = "0.1.0"
