"""Skills: Agent Skills folders the agent reads (a budgeted index, then `skill_view`),
follows, writes (`skill_manage`) and improves (the background review).

Importing this package imports none of its modules (`config` is read by every command of the
CLI, which should not pay for the model client that `review` needs).
"""
