"""The control plane's pure core: what agents report, what the leader decides for
each host, validation of both, and the leader's cluster state. No I/O, no gRPC:
protobuf messages are converted to these records in `cruxd.rpc.convert`."""
