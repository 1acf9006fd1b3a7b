/*
 * fake_ibverbs.c - a libibverbs.so.1 with no devices, for tests/test_record_pidns.py: the four
 * verbs the wrapper (shim/crux_ibverbs.c) forwards to, at IBVERBS_1.1, each succeeding, so a
 * program can drive the wrapper's connect path (its decision and its QP record) on a fake QP
 * without a NIC. Built with a version script that names them.
 */
#include <stddef.h>

#include <infiniband/verbs.h>

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    (void)qp, (void)attr, (void)mask;
    return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
    (void)qp;
    return 0;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    (void)pd, (void)attr;
    return NULL;
}

int ibv_close_device(struct ibv_context *ctx)
{
    (void)ctx;
    return 0;
}
