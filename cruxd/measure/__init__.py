"""Traffic measurement: NIC and communication sampling, iteration-period estimation."""
