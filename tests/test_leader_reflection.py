"""`[leader] reflection`: gRPC server reflection on the leader's port, off unless asked for.

Clients such as grpcurl discover services through grpc.reflection.v1alpha; here the
reflection client grpc ships (ProtoReflectionDescriptorDatabase) and a raw ServerReflection
stream talk to a real cruxd."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from cruxd.config.parse import parse_config
from cruxd.testing import Daemon

pytestmark = pytest.mark.slow


@pytest.fixture
def leader(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    d = Daemon(tmp_path, "h0", {"daemon": {"roles": ["leader"]},
                                "leader": {"listen": "127.0.0.1:0",
                                           "reflection": request.param}})
    d.start()
    try:
        m = re.search(r"leader listening on 127\.0\.0\.1:(\d+)",
                      d.wait_log("leader listening on"))
        assert m
        yield f"127.0.0.1:{m.group(1)}"
    finally:
        assert d.stop() == 0, d.log_text()[-2000:]


def _list_services(channel: grpc.Channel) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    (resp,) = list(stub.ServerReflectionInfo(iter([req]), timeout=10))
    return sorted(s.name for s in resp.list_services_response.service)


@pytest.mark.parametrize("leader", [True], indirect=True)
def test_reflection_lists_and_describes_the_leader(leader: str) -> None:
    with grpc.insecure_channel(leader) as ch:
        assert _list_services(ch) == ["crux.v1.Leader", "grpc.health.v1.Health",
                                      "grpc.reflection.v1alpha.ServerReflection"]
        db = ProtoReflectionDescriptorDatabase(ch)
        pool = DescriptorPool(db)
        methods = {m.name for m in pool.FindServiceByName("crux.v1.Leader").methods}
        assert {"Report", "WatchPlan", "Status", "GetPlan", "GetHints"} <= methods
        report = pool.FindMessageTypeByName("crux.v1.AgentReport")
        assert "host" in report.fields_by_name


@pytest.mark.parametrize("leader", [False], indirect=True)
def test_reflection_is_off_by_default(leader: str) -> None:
    assert parse_config("", "<test>").leader.reflection is False
    with grpc.insecure_channel(leader) as ch, pytest.raises(grpc.RpcError) as err:
        _list_services(ch)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
