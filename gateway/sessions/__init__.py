"""Sessions: admission, busy modes, lanes, turns, commands, cluster signals and API turns.

`SessionManager` (in `manager.py`) is the facade the rest of Herald uses; each module here
holds one idea of it.
"""

from gateway.cron.targets import HOME_SETTING
from gateway.sessions.context import SnapshotReader
from gateway.sessions.keys import derive_session_key
from gateway.sessions.manager import SessionManager
from gateway.sessions.policies import ACKS, POLICIES, BusyPolicy
from gateway.sessions.runner import MAX_ATTEMPTS
from gateway.sessions.state import INTERRUPTED_BY_NEWER
from gateway.sessions.stream import Finished, Token, TurnEvent, TurnRequest, TurnStream

__all__ = [
    "ACKS",
    "HOME_SETTING",
    "INTERRUPTED_BY_NEWER",
    "MAX_ATTEMPTS",
    "POLICIES",
    "BusyPolicy",
    "Finished",
    "SessionManager",
    "SnapshotReader",
    "Token",
    "TurnEvent",
    "TurnRequest",
    "TurnStream",
    "derive_session_key",
]
