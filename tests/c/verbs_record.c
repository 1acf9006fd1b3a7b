/*
 * verbs_record.c - connects one fake QP through the wrapper libibverbs (argv[1], opened and
 * resolved as NCCL does), so the wrapper writes its QP record (shim/crux_qps.h), then says
 * "<rc> <pid>" and lives until stdin closes (tests/test_record_pidns.py, with
 * tests/c/fake_ibverbs.c standing in for the real libibverbs).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

typedef int (*modify_fn)(struct ibv_qp *, struct ibv_qp_attr *, int);

int main(int argc, char **argv)
{
    void *h = argc > 1 ? dlopen(argv[1], RTLD_NOW) : NULL;
    modify_fn modify = h != NULL ? (modify_fn)dlvsym(h, "ibv_modify_qp", "IBVERBS_1.1") : NULL;
    if (modify == NULL) {
        fprintf(stderr, "cannot open the wrapper: %s\n", dlerror());
        return 1;
    }
    static struct ibv_device dev;
    static struct ibv_context ctx;
    static struct ibv_qp qp;
    strcpy(dev.name, "mlx5_0");
    ctx.device = &dev;
    qp.context = &ctx;
    qp.qp_num = 17;
    struct ibv_qp_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.dest_qp_num = 18;
    attr.ah_attr.port_num = 1;
    attr.ah_attr.is_global = 1;
    static const uint8_t peer[16] = {[10] = 0xff, [11] = 0xff, [12] = 10, [15] = 2};
    memcpy(attr.ah_attr.grh.dgid.raw, peer, sizeof peer);
    int rc = modify(&qp, &attr, IBV_QP_AV);
    printf("%d %d\n", rc, (int)getpid());
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin) != NULL) {
    }
    return 0;
}
