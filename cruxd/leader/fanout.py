"""What WatchPlan streams send for one published plan, each distinct message serialised
once: a host's full HostPlan (cached per host, for every stream of that host and every
reconnect), or the watermark shared by all hosts whose decisions did not change since the
generation they hold (cruxd.control.plan_delta)."""

from __future__ import annotations

from cruxd.control.host_plans import PublishedPlan
from cruxd.rpc import convert
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb


class FanOut:
    def __init__(self, plan: PublishedPlan) -> None:
        self.plan = plan
        self._full: dict[str, bytes] = {}
        self._marks: dict[int, bytes] = {}  # by the generation the agent holds
        self.full_sent = 0
        self.marks_sent = 0

    @property
    def sent(self) -> int:
        return self.full_sent + self.marks_sent

    def message(self, host: str, have: int) -> bytes:
        """The bytes for `host`, which holds generation `have` (0: none)."""
        p = self.plan
        if have and (have == p.generation or p.unchanged_since(host, have)):
            # have == generation: a new stream of a host on this plan already. The
            # watermark still goes: it is how the agent learns that the stream is up,
            # and a new leader resuming the same generation must hear the host again.
            self.marks_sent += 1
            mark = self._marks.get(have)
            if mark is None:
                mark = self._marks[have] = lpb.HostPlan(
                    schema=convert.SCHEMA, generation=p.generation,
                    planned_unix_ms=p.planned_unix_ms, term=p.term, unchanged=True,
                    base_generation=have).SerializeToString()
            return mark
        self.full_sent += 1
        full = self._full.get(host)
        if full is None:
            full = self._full[host] = convert.host_plan_to_pb(p.for_host(host)
                                                              ).SerializeToString()
        return full
