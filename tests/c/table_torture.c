/* Torn-read detector: reads entry 0 of a table as fast as it can for SECONDS while a writer
 * rewrites it, and checks the invariant the test writer keeps for every n it publishes:
 *
 *   job_id "torture", job-wide, plan_generation n, level n%251, dscp n%61, tc n%239,
 *   sport n%65536
 *
 * A read that mixes two writes breaks it. Prints the counts; exits 1 on the first torn read.
 *
 *   table_torture PATH SECONDS */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crux_table.h"
#include "table_util.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int consistent(const struct crux_table_entry *e)
{
    static const uint8_t zero[16];
    uint64_t n = e->plan_generation;
    return strcmp(e->job_id, "torture") == 0 && memcmp(e->peer, zero, 16) == 0 &&
           e->flags == CRUX_ENTRY_JOB_WIDE && e->level == n % 251 && e->dscp == n % 61 &&
           e->traffic_class == n % 239 && e->sport == n % 65536;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PATH SECONDS\n", argv[0]);
        return 2;
    }
    const void *base;
    size_t len;
    if (map_table(argv[1], &base, &len) != 0)
        return 2;
    if (base == NULL || crux_table_validate(base, len) != 0 ||
        ((const struct crux_table_header *)base)->capacity < 1) {
        fprintf(stderr, "%s: not a usable table\n", argv[1]);
        return 2;
    }
    const struct crux_table_entry *e0 = crux_table_entries(base);
    double end = now_s() + atof(argv[2]);
    uint64_t reads = 0, ok = 0, free_ = 0, gaveup = 0, changes = 0, last = 0;
    for (;;) {
        if ((reads & 1023) == 0 && now_s() >= end)
            break;
        struct crux_table_entry e;
        reads++;
        if (crux_table_read_entry(e0, &e) != 0) {
            gaveup++;
            continue;
        }
        if (e.state == CRUX_ENTRY_FREE) {
            free_++;
            continue;
        }
        if (e.state != CRUX_ENTRY_LIVE || !consistent(&e)) {
            printf("torn read after %" PRIu64 " reads: state=%u job=%.*s level=%u dscp=%u tc=%u "
                   "sport=%u gen=%" PRIu64 "\n", reads, e.state, CRUX_JOB_ID_LEN, e.job_id,
                   e.level, e.dscp, e.traffic_class, e.sport, e.plan_generation);
            return 1;
        }
        ok++;
        if (e.plan_generation != last) {
            changes++;
            last = e.plan_generation;
        }
    }
    printf("reads=%" PRIu64 " ok=%" PRIu64 " free=%" PRIu64 " gaveup=%" PRIu64
           " changes=%" PRIu64 " last=%" PRIu64 "\n", reads, ok, free_, gaveup, changes, last);
    return 0;
}
