"""Samplers that read the host: NVML, NIC counters, the C counter loop, PCIe links (I/O).

The pure estimators they feed (period, comm, estimate, window) sit one level up.
"""
