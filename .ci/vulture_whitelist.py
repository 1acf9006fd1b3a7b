# ruff: noqa
"""Names vulture reports as unused that are used, by a framework or by design.

    .venv/bin/vulture cruxd transport probing tests bench .ci/vulture_whitelist.py \
        --min-confidence 60 --exclude cruxd/rpc/gen

tests/ and bench/ are scanned too, so code only they use counts as used. Every entry says why
it stays; a name that is really dead goes from the code, not into this file. Never run.
"""

# Called by a framework, not by our code.
_.kvstub  # cruxd/leader/etcd.py: aetcd's Client methods call its stubs; our connect() sets them
_.clusterstub  # cruxd/leader/etcd.py: as above
_.leasestub  # cruxd/leader/etcd.py: as above
_.maintenancestub  # cruxd/leader/etcd.py: as above
_._watcher  # cruxd/leader/etcd.py: aetcd's watch() and close() use it
__getattr__  # cruxd/scheduler/__init__.py: PEP 562 lazy module attributes (plan, PlanConfig)
_.collect  # cruxd/daemon/exporter.py: prometheus_client's Collector protocol
fields_desc  # tests/int_scapy.py (the INT-MD reference decoder): scapy's layer declaration
_.extract_padding  # tests/int_scapy.py (the INT-MD reference decoder): scapy Packet hook
_.post_build  # tests/int_scapy.py (the INT-MD reference decoder): scapy Packet hook
_.guess_payload_class  # tests/int_scapy.py (the INT-MD reference decoder): scapy Packet hook
pytest_configure  # tests/conftest.py: pytest hook
pytest_collection_modifyitems  # tests/conftest.py: pytest hook
examples  # tests/conftest.py: pytest fixture, requested by parameter name
_default_lease  # tests/test_pcie_attacks.py: an autouse fixture (the built-in lease for every test)
_no_lease  # tests/test_pcie_locks.py: an autouse fixture (no lease: strict mutual exclusion)
_no_settle  # tests/test_ha_standby.py: an autouse fixture (the standby decodes at once)
wake  # transport/pcie.py: Layout mirrors every offset of crux_pcie.h's link record, read or not
checked_ns  # transport/pcie.py: as above
waiter_size  # transport/pcie.py: as above (the queue slot's size)
pytestmark  # tests/*: module-level pytest marks
signum  # bench/control_plane.py: a signal handler's required parameter

# Written for a library that reads them: pyverbs' QPAttr (transport/verbs.py).
_.qp_access_flags
_.port_num
_.path_mtu
_.dest_qp_num
_.rq_psn
_.sq_psn
_.max_dest_rd_atomic
_.max_rd_atomic
_.min_rnr_timer
_.retry_cnt
_.rnr_retry

# Fields of records and results: every field of the wire format or estimate is kept, read or not.
sgid_index  # transport/qp_records.py: QP record layout (shim/crux_records.h)
orig_flow_label  # transport/qp_records.py
table_generation  # transport/qp_records.py
created_ns  # transport/qp_records.py, transport/sock_records.py
max_unit_spread  # cruxd/hints/arnold_mip.py: Placement, the MIP's objective T
lag_samples  # cruxd/measure/period.py: PeriodEstimate
peaks_fit  # cruxd/measure/period.py: PeriodEstimate
FIN  # probing/tcp_wire.py: TCP flag constants, the set in one line
PSH  # probing/tcp_wire.py
SLOT_FREE  # transport/nccl_records.py: the slot states of shim/crux_ncclrec.h, named together
writes  # transport/nccl_records.py: NcclRecord, the file's rewrite count (a reader's check)
