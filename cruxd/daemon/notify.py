"""The sd_notify(3) protocol, spoken directly rather than through libsystemd.

systemd hands a service a datagram socket in NOTIFY_SOCKET; the service sends
newline-separated KEY=VALUE assignments to it (READY=1, STATUS=..., WATCHDOG=1).
The protocol is small enough that a dependency on libsystemd (and a C build on
every host) is not worth it.

Sending never raises: systemd going away (a restart of PID 1, a container without
it) must not take the daemon down. The first failure is logged at warning, later
ones at debug, so a missing socket does not flood the journal every watchdog ping.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time
from collections.abc import Mapping

from cruxd.waits import wait_event

log = logging.getLogger(__name__)

# sd_notify keys are upper-case identifiers; anything else is a caller's bug.
_KEY = re.compile(r"[A-Z][A-Z0-9_]*\Z")
# A blocked send (systemd not draining its queue) must not stall the event loop
# for long, but READY=1 should survive a momentary backlog: a short timeout.
_SEND_TIMEOUT_S = 1.0


def _parse_usec(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer number of microseconds") from None
    if value <= 0:
        raise ValueError(f"{name}={text!r} must be positive")
    return value


def _socket_address(text: str) -> str | bytes:
    """NOTIFY_SOCKET as sendto() wants it: a path, or a NUL-led abstract name."""
    if text.startswith("@") and len(text) > 1:
        return b"\0" + text[1:].encode()
    if text.startswith("/"):
        return text
    raise ValueError(f"NOTIFY_SOCKET={text!r}: expected an absolute path or '@name'")


class Notifier:
    """Talks to the service manager; every method is a no-op when not under systemd."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        """`address` is NOTIFY_SOCKET verbatim (None: not under systemd).

        `watchdog_usec` is the manager's watchdog timeout (None: watchdog off).
        """
        self._address = _socket_address(address) if address else None
        self._display = address or ""
        if watchdog_usec is not None and watchdog_usec <= 0:
            raise ValueError(f"watchdog_usec must be positive, got {watchdog_usec}")
        self._watchdog_usec = watchdog_usec
        self._warned = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Notifier:
        """Read NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID as sd_watchdog_enabled(3) does.

        Malformed values raise ValueError: systemd never writes them, so someone
        edited the environment by hand and should hear about it at startup.
        """
        address = env.get("NOTIFY_SOCKET") or None
        usec_text = env.get("WATCHDOG_USEC")
        usec = _parse_usec("WATCHDOG_USEC", usec_text) if usec_text else None
        pid_text = env.get("WATCHDOG_PID")
        if usec is not None and pid_text:
            # The variables leak into children; only the intended process pings.
            try:
                pid = int(pid_text)
            except ValueError:
                raise ValueError(f"WATCHDOG_PID={pid_text!r} is not a process id") from None
            if pid != os.getpid():
                usec = None
        return cls(address, usec)

    @property
    def enabled(self) -> bool:
        """True when a notification socket was given (running under systemd)."""
        return self._address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """Seconds between pings, half the timeout as sd_watchdog_enabled(3) advises."""
        if self._address is None or self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 2 / 1_000_000

    def send(self, text: str = "", /, **fields: object) -> bool:
        """Send raw `KEY=VALUE` lines and/or keyword fields; True if delivered.

        Input is validated even when disabled, so bad calls fail in tests too.
        """
        lines = [line for line in text.split("\n") if line]
        for line in lines:
            key, sep, _ = line.partition("=")
            if not sep or not _KEY.match(key):
                raise ValueError(f"not a KEY=VALUE assignment: {line!r}")
        for key, value in fields.items():
            if not _KEY.match(key):
                raise ValueError(f"not an sd_notify key: {key!r}")
            rendered = str(value)
            if "\n" in rendered:
                raise ValueError(f"newline in the value of {key}")
            lines.append(f"{key}={rendered}")
        if not lines:
            raise ValueError("nothing to send")
        if self._address is None:
            return False
        return self._sendto("\n".join(lines).encode())

    def _sendto(self, payload: bytes) -> bool:
        assert self._address is not None
        try:
            # A fresh socket per message, as libsystemd does: nothing to reconnect
            # after the manager restarts, and nothing held open between pings.
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.settimeout(_SEND_TIMEOUT_S)
                sock.sendto(payload, self._address)
        except OSError as exc:
            level = logging.DEBUG if self._warned else logging.WARNING
            self._warned = True
            log.log(level, "sd_notify to %s failed: %s", self._display, exc)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Startup (or a reload) finished: systemd marks the unit active."""
        if status is None:
            return self.send(READY=1)
        return self.send(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        """A one-line state shown by `systemctl status`."""
        return self.send(STATUS=text)

    def watchdog(self) -> bool:
        """Keep-alive ping; without one per WatchdogSec systemd kills and restarts us."""
        return self.send(WATCHDOG=1)

    def stopping(self) -> bool:
        """Shutdown began; systemd waits (up to TimeoutStopSec) rather than escalating."""
        return self.send(STOPPING=1)

    def reloading(self) -> bool:
        """Reload began; follow with ready() when done.

        MONOTONIC_USEC lets systemd >= 253 (Type=notify-reload) tell this reload
        from an earlier one; older managers ignore the unknown field.
        """
        now_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send(RELOADING=1, MONOTONIC_USEC=now_usec)


async def watchdog_loop(notifier: Notifier, stop: asyncio.Event) -> None:
    """Ping the watchdog until `stop` is set; return at once if it is disabled.

    Running on the event loop is the point: if the loop wedges, the pings stop and
    systemd restarts the daemon.
    """
    interval = notifier.watchdog_interval_s
    if interval is None:
        return
    while not stop.is_set():
        notifier.watchdog()
        await wait_event(stop, interval)
