"""Putting decisions on the wire: RoCEv2 QPs, TCP sockets, the decision table."""
