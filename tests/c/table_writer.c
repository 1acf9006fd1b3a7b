/* Test writer: creates a decision table the way the C side understands it.
 *
 *   table_writer PATH CAPACITY PLAN_GEN [JOB PEER LEVEL DSCP TC SPORT GEN]...
 *
 * PEER is IPv4/IPv6 text or "-" (job-wide). Entries go to slots 0, 1, ... in argument order,
 * each written once with crux_table_write_entry; generation ends at 1. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "crux_table.h"
#include "table_util.h"


int main(int argc, char **argv)
{
    if (argc < 4 || (argc - 4) % 7 != 0) {
        fprintf(stderr, "usage: %s PATH CAPACITY PLAN_GEN [JOB PEER LEVEL DSCP TC SPORT GEN]...\n",
                argv[0]);
        return 2;
    }
    uint32_t capacity = (uint32_t)strtoul(argv[2], NULL, 0);
    uint32_t n = (uint32_t)(argc - 4) / 7;
    if (n > capacity) {
        fprintf(stderr, "%u entries do not fit in %u slots\n", n, capacity);
        return 2;
    }
    size_t len = CRUX_TABLE_HEADER_SIZE + (size_t)capacity * CRUX_TABLE_ENTRY_SIZE;
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        perror(argv[1]);
        return 2;
    }
    void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    struct crux_table_header *h = base;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    h->magic = CRUX_TABLE_MAGIC;
    h->version = CRUX_TABLE_VERSION;
    h->header_size = CRUX_TABLE_HEADER_SIZE;
    h->entry_size = CRUX_TABLE_ENTRY_SIZE;
    h->capacity = capacity;
    h->plan_generation = strtoull(argv[3], NULL, 0);
    h->updated_ns = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    h->writer_pid = (uint32_t)getpid();

    struct crux_table_entry *entries = (struct crux_table_entry *)crux_table_entries(base);
    for (uint32_t i = 0; i < n; i++) {
        char **a = argv + 4 + 7 * i;
        struct crux_table_entry e;
        memset(&e, 0, sizeof e);
        if (strlen(a[0]) >= CRUX_JOB_ID_LEN || parse_peer(a[1], e.peer) != 0) {
            fprintf(stderr, "bad job or peer: %s %s\n", a[0], a[1]);
            return 2;
        }
        strncpy(e.job_id, a[0], CRUX_JOB_ID_LEN - 1);
        e.state = CRUX_ENTRY_LIVE;
        e.flags = strcmp(a[1], "-") == 0 ? CRUX_ENTRY_JOB_WIDE : 0;
        e.level = (uint8_t)strtoul(a[2], NULL, 0);
        e.dscp = (uint8_t)strtoul(a[3], NULL, 0);
        e.traffic_class = (uint8_t)strtoul(a[4], NULL, 0);
        e.sport = (uint16_t)strtoul(a[5], NULL, 0);
        e.plan_generation = strtoull(a[6], NULL, 0);
        crux_table_write_entry(&entries[i], &e);
    }
    atomic_store_explicit((_Atomic uint32_t *)&h->used, n, memory_order_release);
    atomic_store_explicit((_Atomic uint64_t *)&h->generation, 1, memory_order_release);
    return munmap(base, len) == 0 && close(fd) == 0 ? 0 : 1;
}
