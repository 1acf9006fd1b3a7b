"""The RPC edge: generated stubs (`gen/`, built from proto/ at install time), the
one module converting protobuf messages to domain records, the local socket's
framing, and TLS credentials."""
