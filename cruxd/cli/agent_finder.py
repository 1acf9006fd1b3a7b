"""Which crux agent serves this user: the host's system agent, else the user's own.

One agent runs per host: systemd's cruxd, as root, with its socket at /run/crux/agent.sock
(mode 0660, group crux). A job of any uid uses it whenever it runs. The per-user default
($XDG_RUNTIME_DIR/crux, else /tmp/crux-UID) is only for a cruxd that this same user started
unprivileged, so a socket there counts only when this user owns it.

Nothing here creates a directory or a file: a client run by a Slurm TaskProlog must not
leave /tmp/crux-UID behind, and must not point a job at a table no agent writes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cruxd.config.fields import default_runtime_dir

SYSTEM_RUNTIME_DIR = Path("/run/crux")
SYSTEM_SOCKET = SYSTEM_RUNTIME_DIR / "agent.sock"


@dataclass(frozen=True, slots=True)
class AgentPlace:
    socket: Path
    origin: str  # how it was chosen, for messages: "--socket", "$CRUX_SOCKET", ...


@dataclass(frozen=True, slots=True)
class Search:
    """The outcome of looking: the agent's place, else why none was taken."""

    place: AgentPlace | None
    looked: tuple[str, ...]  # each place looked at and what was there, for the message

    @property
    def why_none(self) -> str:
        return "no crux agent serves this user (" + "; ".join(self.looked) + ")"


def _socket_owner(path: Path) -> int | None:
    """The owner's uid when `path` is a Unix socket, else None (absent, or anything else)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_uid if stat.S_ISSOCK(st.st_mode) else None


def find_agent(explicit: str | Path | None = None, env: Mapping[str, str] | None = None,
               euid: int | None = None, system_socket: Path = SYSTEM_SOCKET) -> Search:
    """The socket to use: given (--socket), else $CRUX_SOCKET, else the system agent's when
    one runs, else this user's own agent's. A given socket is taken as it is: the caller
    then reports whatever connecting to it says."""
    env = os.environ if env is None else env
    euid = os.geteuid() if euid is None else euid
    if explicit:
        return Search(AgentPlace(Path(explicit), "--socket"), ())
    if env.get("CRUX_SOCKET"):
        return Search(AgentPlace(Path(env["CRUX_SOCKET"]), "$CRUX_SOCKET"), ())
    looked = []
    if _socket_owner(system_socket) is not None:
        return Search(AgentPlace(system_socket, "the host's agent"), ())
    looked.append(f"nothing at {system_socket}")
    own = default_runtime_dir(env, euid) / "agent.sock"
    if own != system_socket:
        owner = _socket_owner(own)
        if owner == euid:
            return Search(AgentPlace(own, "this user's own agent"), ())
        looked.append(f"nothing at {own}" if owner is None else
                      f"{own} belongs to uid {owner}, not to this user: ignored")
    return Search(None, tuple(looked))
