/* Test reader: prints a decision table's header and every live entry, then answers lookups.
 *
 *   table_reader PATH [JOB PEER]...    PEER is IPv4/IPv6 text, or "-" for the job-wide entry
 *
 * Exit 0; 3 if the table is invalid (lookups still run and must all miss: fail open). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crux_table.h"
#include "table_util.h"


static void print_entry(const struct crux_table_entry *e)
{
    printf("job=%.*s peer=", CRUX_JOB_ID_LEN, e->job_id);
    for (int i = 0; i < 16; i++)
        printf("%02x", e->peer[i]);
    printf(" flags=%u level=%u dscp=%u tc=%u sport=%u gen=%" PRIu64 "\n", e->flags, e->level,
           e->dscp, e->traffic_class, e->sport, e->plan_generation);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc % 2 != 0) {
        fprintf(stderr, "usage: %s PATH [JOB PEER]...\n", argv[0]);
        return 2;
    }
    const void *base;
    size_t len;
    if (map_table(argv[1], &base, &len) != 0)
        return 2;
    int valid = crux_table_validate(base, len) == 0;
    if (valid) {
        const struct crux_table_header *h = base;
        printf("header magic=0x%016" PRIx64 " version=%u header_size=%u entry_size=%u "
               "capacity=%u generation=%" PRIu64 " plan_generation=%" PRIu64
               " updated_ns=%" PRIu64 " writer_pid=%u flags=%u used=%u retired=%d\n",
               h->magic, h->version, h->header_size, h->entry_size, h->capacity,
               crux_table_generation(h), h->plan_generation, h->updated_ns, h->writer_pid,
               h->flags, h->used, crux_table_retired(h));
        const struct crux_table_entry *entries = crux_table_entries(base);
        for (uint32_t i = 0; i < h->capacity; i++) {
            struct crux_table_entry e;
            if (crux_table_read_entry(&entries[i], &e) != 0) {
                printf("entry slot=%u torn\n", i);
                continue;
            }
            if (e.state == CRUX_ENTRY_FREE)
                continue;
            printf("entry slot=%u seq=%u state=%u ", i, e.seq, e.state);
            print_entry(&e);
        }
    } else {
        printf("invalid\n");
    }
    for (int a = 2; a + 1 < argc; a += 2) {
        uint8_t peer[16];
        struct crux_table_entry e;
        printf("lookup %s %s ", argv[a], argv[a + 1]);
        if (parse_peer(argv[a + 1], peer) != 0) {
            printf("badpeer\n");
        } else if (crux_table_lookup(base, len, argv[a], strcmp(argv[a + 1], "-") ? peer : NULL,
                                     &e) == 0) {
            printf("found ");
            print_entry(&e);
        } else {
            printf("miss\n");
        }
    }
    return valid ? 0 : 3;
}
