/*
 * decide_check - run the shim's pure core (crux_decide.c) on a real decision table file, the
 * way the wrapper does on a connect, and print what the NIC would be given.
 *
 * usage: decide_check TABLE JOB PEER TC FLOW_LABEL [RECORDS]
 *   TABLE "-" for none; PEER IPv4/IPv6 text (the remote GID); TC/FLOW_LABEL the program's own.
 *   RECORDS: also write this connect as a QP record into a new records file at that path.
 * Prints: outcome=N flow_label=N traffic_class=N sport=N
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>

#include "crux_shim.h"
#include "table_util.h"

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: decide_check TABLE JOB PEER TC FLOW_LABEL [RECORDS]\n");
        return 2;
    }
    const void *table = NULL;
    size_t len = 0;
    static const char empty[1];
    if (strcmp(argv[1], "-") != 0) {
        if (map_table(argv[1], &table, &len) != 0)
            return 2;
        if (table == NULL)
            table = empty; /* an empty file is a bad table, as in the wrapper */
    }
    struct ibv_ah_attr ah;
    memset(&ah, 0, sizeof ah);
    ah.is_global = 1;
    ah.grh.traffic_class = (uint8_t)strtoul(argv[4], NULL, 0);
    ah.grh.flow_label = (uint32_t)strtoul(argv[5], NULL, 0);
    if (parse_peer(argv[3], ah.grh.dgid.raw) != 0) {
        fprintf(stderr, "decide_check: bad peer %s\n", argv[3]);
        return 2;
    }
    struct ibv_ah_attr orig = ah;
    struct crux_applied d;
    crux_decide(table, len, argv[2], &ah, &d);
    printf("outcome=%d flow_label=%u traffic_class=%u sport=%u\n", d.outcome, ah.grh.flow_label,
           ah.grh.traffic_class, d.sport);
    if (argc > 6) {
        size_t qlen = CRUX_QPS_HEADER_SIZE + 4 * CRUX_QPS_RECORD_SIZE;
        int fd = open(argv[6], O_RDWR | O_CREAT | O_TRUNC, 0644);
        void *q = fd < 0 || ftruncate(fd, (off_t)qlen) != 0 ? MAP_FAILED
                  : mmap(NULL, qlen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (q == MAP_FAILED) {
            perror(argv[6]);
            return 2;
        }
        crux_qps_init(q, qlen, (uint32_t)getpid(), argv[2]);
        struct crux_qps_record r = {.outcome = d.outcome, .port_num = 1, .sgid_index = 3,
                                    .qpn = 17, .dest_qpn = 18,
                                    .orig_flow_label = orig.grh.flow_label,
                                    .flow_label = ah.grh.flow_label, .sport = d.sport,
                                    .orig_traffic_class = orig.grh.traffic_class,
                                    .traffic_class = ah.grh.traffic_class, .level = d.level,
                                    .dscp = d.dscp, .plan_generation = d.plan_generation};
        memcpy(r.dgid, ah.grh.dgid.raw, 16);
        memcpy(r.device, "mlx5_0", 7);
        crux_qps_count(q, d.outcome);
        crux_qps_add(q, &r);
        close(fd);
    }
    return 0;
}
