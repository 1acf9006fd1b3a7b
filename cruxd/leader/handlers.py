"""The leader's gRPC method table, with requests that are no protobuf message refused.

The generated `add_LeaderServicer_to_server` parses each request with `FromString`; bytes
that do not parse raise inside gRPC, the caller sees UNKNOWN and nothing counts it. Here
parsing never raises: it yields a `Garbled` request, which the method wrapper answers with
INVALID_ARGUMENT and counts in `crux_rpc_rejected_total{rpc, field="message"}`, before the
servicer (and whatever it checks) sees anything.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from cruxd.rpc.gen.crux.v1 import common_pb2 as cpb
from cruxd.rpc.gen.crux.v1 import leader_pb2 as lpb

LOG = logging.getLogger(__name__)
SERVICE = "crux.v1.Leader"
Context = grpc.aio.ServicerContext[Any, Any]
OnReject = Callable[[str, str], None]

# method -> (request type, response type, server-streaming)
METHODS: dict[str, tuple[type[Message], type[Message], bool]] = {
    "Report": (lpb.AgentReport, lpb.ReportAck, False),
    "WatchPlan": (lpb.WatchRequest, lpb.HostPlan, True),
    "Status": (lpb.StatusRequest, cpb.ClusterStatus, False),
    "GetPlan": (lpb.PlanRequest, cpb.PlanDocument, False),
    "GetHints": (cpb.HintsRequest, cpb.HintsDocument, False),
}


@dataclass(frozen=True, slots=True)
class Garbled:
    """A request whose bytes are not a `kind` message."""

    kind: str
    error: str


def _parser(kind: type[Message]) -> Callable[[bytes], Message | Garbled]:
    def parse(data: bytes) -> Message | Garbled:
        try:
            return kind.FromString(data)
        except DecodeError as exc:
            return Garbled(kind.DESCRIPTOR.full_name, str(exc))
    return parse


async def _refuse(rpc: str, request: Garbled, context: Context, on_reject: OnReject) -> None:
    on_reject(rpc, "message")
    LOG.warning("%s rejected from %s: not a valid %s message (%s)", rpc, context.peer(),
                request.kind, request.error)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                        f"not a valid {request.kind} message: {request.error}")


def _unary(rpc: str, method: Callable[..., Any], on_reject: OnReject) -> Callable[..., Any]:
    async def call(request: Message | Garbled, context: Context) -> Any:
        if isinstance(request, Garbled):
            await _refuse(rpc, request, context, on_reject)
        return await method(request, context)
    return call


def _stream(rpc: str, method: Callable[..., Awaitable[None]],
            on_reject: OnReject) -> Callable[..., Awaitable[None]]:
    # a coroutine: gRPC then lets the method write its messages (context.write), which
    # costs the fan-out to 10,000 streams less than items passed up through generators
    async def call(request: Message | Garbled, context: Context) -> None:
        if isinstance(request, Garbled):
            await _refuse(rpc, request, context, on_reject)
            return
        await method(request, context)
    return call


def _serialise(message: Message | bytes) -> bytes:
    """Messages the servicer serialised already (one plan's bytes go to many streams)
    pass as they are."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def add_leader(servicer: object, server: grpc.aio.Server, on_reject: OnReject) -> None:
    """Serve `servicer`'s methods of crux.v1.Leader on `server`."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for rpc, (request, response, streaming) in METHODS.items():
        method = getattr(servicer, rpc)
        if streaming:
            handlers[rpc] = grpc.unary_stream_rpc_method_handler(
                _stream(rpc, method, on_reject), request_deserializer=_parser(request),
                response_serializer=_serialise)
        else:
            handlers[rpc] = grpc.unary_unary_rpc_method_handler(
                _unary(rpc, method, on_reject), request_deserializer=_parser(request),
                response_serializer=response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
