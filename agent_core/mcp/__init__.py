"""Tools from MCP servers (the `mcp` SDK): `config` (the `mcp` section), `server` (one
connection kept up), `hub` (all of them, as a context manager), `tools` (the tool source),
`status` (a server's state and its tools' names).

Only `server` imports the SDK, and `hub` imports `server` only when a server is configured:
a daemon without MCP servers never loads it (a third of a second of CPU at every start).
"""
