"""The agent's tools."""

from agent_core.tools.base import Tool, ToolContext, ToolError, ToolRegistry, ToolSource
from agent_core.tools.memory_tool import MemoryTool
from agent_core.tools.schedule_job import JobControl, ScheduleJobTool
from agent_core.tools.send_message import ChannelSender, SendMessageTool
from agent_core.tools.session_search import SessionSearchTool

__all__ = [
    "ChannelSender",
    "JobControl",
    "MemoryTool",
    "ScheduleJobTool",
    "SendMessageTool",
    "SessionSearchTool",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolSource",
]
