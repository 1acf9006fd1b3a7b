/*
 * repath_check - drives crux_repath.c without a NIC (tests/test_repath.py).
 *   repath_check FAKE_LIB   libmlx5 "loaded" (the fake, opened first): mlx5 QPs are re-pathed
 *   repath_check            no libmlx5 in the process: nothing is tracked, nothing moves
 * QPs are plain structs: the module reads only qp->context->device and qp->qp_num.
 * Exit 0 when every check holds, else 1 with the failed check on stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "crux_repath.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "failed: %s (line %d)\n", #c, __LINE__); \
                                  return 1; } } while (0)

static int decided = 0;
static int repathed_calls;
static uint16_t repathed_sport;

static int decided_sport(const uint8_t dgid[16])
{
    (void)dgid;
    return decided;
}

static void repathed(struct ibv_qp *qp, uint16_t sport)
{
    (void)qp;
    repathed_calls++;
    repathed_sport = sport;
}

int main(int argc, char **argv)
{
    struct ibv_device mlx, rxe;
    struct ibv_context cm, cr;
    struct ibv_qp qm, qr;
    uint8_t gid[16] = {0};
    memset(&mlx, 0, sizeof mlx);
    memset(&rxe, 0, sizeof rxe);
    strcpy(mlx.name, "mlx5_0");
    strcpy(rxe.name, "rxe0");
    memset(&cm, 0, sizeof cm);
    memset(&cr, 0, sizeof cr);
    cm.device = &mlx;
    cr.device = &rxe;
    memset(&qm, 0, sizeof qm);
    memset(&qr, 0, sizeof qr);
    qm.context = &cm, qm.qp_num = 17;
    qr.context = &cr, qr.qp_num = 18;
    struct crux_repath_hooks h = {decided_sport, repathed};
    crux_repath_configure(&h, 0, 1);

    if (argc < 2) { /* no libmlx5: nothing tracked, whatever the device */
        CHECK(crux_repath_track(&qm, gid, 0xC001) == 0);
        decided = 0xD002;
        CHECK(crux_repath_pass() == 0);
        puts("ok");
        return 0;
    }
    void *fake = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    CHECK(fake != NULL);
    int *calls = dlsym(fake, "fake_calls");
    uint16_t *last = dlsym(fake, "fake_last_sport");
    CHECK(crux_repath_track(&qr, gid, 0xC001) == 0); /* not an mlx5 device */
    CHECK(crux_repath_track(&qm, gid, 0xC001) == 1);
    decided = 0xC001; /* unchanged decision: no call */
    CHECK(crux_repath_pass() == 0 && *calls == 0);
    decided = 0; /* a decision without a port leaves the QP where it is */
    CHECK(crux_repath_pass() == 0 && *calls == 0);
    decided = 0xD002; /* moved: re-pathed once, and the wrapper told */
    CHECK(crux_repath_pass() == 1 && *calls == 1 && *last == 0xD002);
    CHECK(repathed_calls == 1 && repathed_sport == 0xD002);
    CHECK(crux_repath_pass() == 0 && *calls == 1);
    decided = 0xBAD0; /* refused by the NIC: tried once, not hammered, stays on 0xD002 */
    CHECK(crux_repath_pass() == 0 && *calls == 2);
    CHECK(crux_repath_pass() == 0 && *calls == 2 && repathed_calls == 1);
    decided = 0xE003; /* a new decision is tried again */
    CHECK(crux_repath_pass() == 1 && *calls == 3 && *last == 0xE003);
    crux_repath_forget(&qm); /* destroyed: never touched again */
    decided = 0xF004;
    CHECK(crux_repath_pass() == 0 && *calls == 3);
    /* connected before its job's first decision (port 0: the NIC chose): left alone while
     * there is none, moved once one arrives (crux-run's wait ran out, or it never waited) */
    struct ibv_qp qe = qm;
    qe.qp_num = 19;
    decided = 0;
    CHECK(crux_repath_track(&qe, gid, 0) == 1);
    CHECK(crux_repath_pass() == 0 && *calls == 3);
    decided = 0xC123;
    CHECK(crux_repath_pass() == 1 && *calls == 4 && *last == 0xC123);
    puts("ok");
    return 0;
}
