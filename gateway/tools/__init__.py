"""The gateway's side of the agent's tools: where `send_message` may send, who approves a
tool call, who a tool context's person is, and the `tools` config section."""
