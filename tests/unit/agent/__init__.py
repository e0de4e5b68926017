"""Unit tests of agent_core: memory files, context, tools, the tool loop, compression, agent."""
