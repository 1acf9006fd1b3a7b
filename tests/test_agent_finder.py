"""Which agent a client uses (cruxd/cli/agent_finder.py): the host's agent for every user,
a user's own agent only when that user owns its socket, and never a directory created by
looking."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from cruxd.cli.agent_finder import find_agent


@pytest.fixture
def listening(short_dir: Path) -> Iterator[Path]:
    path = short_dir / "agent.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        yield path


def test_given_socket_and_env_come_first(short_dir: Path, listening: Path) -> None:
    got = find_agent("/x/y.sock", env={"CRUX_SOCKET": "/e.sock"}, system_socket=listening)
    assert got.place is not None and (got.place.socket, got.place.origin) == (
        Path("/x/y.sock"), "--socket")
    got = find_agent(None, env={"CRUX_SOCKET": "/e.sock"}, system_socket=listening)
    assert got.place is not None and got.place.socket == Path("/e.sock")


def test_the_hosts_agent_serves_every_user(short_dir: Path, listening: Path) -> None:
    for euid in (0, 1000, 65534):
        got = find_agent(None, env={"XDG_RUNTIME_DIR": str(short_dir)}, euid=euid,
                         system_socket=listening)
        assert got.place is not None and got.place.socket == listening
        assert got.place.origin == "the host's agent"


def test_a_users_own_agent_counts_only_when_the_user_owns_it(short_dir: Path) -> None:
    own_dir = short_dir / "crux"
    own_dir.mkdir()
    # root's own default is /run/crux itself: act as an ordinary uid (chown needs root)
    uid = 12345 if os.geteuid() == 0 else os.geteuid()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(own_dir / "agent.sock"))
        if os.geteuid() == 0:
            os.chown(own_dir / "agent.sock", uid, -1)
        env = {"XDG_RUNTIME_DIR": str(short_dir)}
        mine = find_agent(None, env=env, euid=uid, system_socket=short_dir / "no")
        assert mine.place is not None and mine.place.origin == "this user's own agent"
        theirs = find_agent(None, env=env, euid=uid + 1, system_socket=short_dir / "no")
    assert theirs.place is None
    assert f"belongs to uid {uid}, not to this user" in theirs.why_none


def test_looking_creates_nothing(short_dir: Path) -> None:
    uid = 61000 + os.getpid() % 1000  # a uid with no /tmp/crux-<uid> of its own
    tmp_own = Path(f"/tmp/crux-{uid}")
    assert not tmp_own.exists()
    got = find_agent(None, env={}, euid=uid, system_socket=short_dir / "none.sock")
    assert got.place is None and not tmp_own.exists()
    assert got.why_none == (f"no crux agent serves this user (nothing at "
                            f"{short_dir / 'none.sock'}; nothing at {tmp_own / 'agent.sock'})")


def test_a_file_that_is_not_a_socket_is_no_agent(short_dir: Path) -> None:
    fake = short_dir / "agent.sock"
    fake.write_text("")
    assert find_agent(None, env={}, euid=12345, system_socket=fake).place is None
