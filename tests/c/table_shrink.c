/* Test reader for a table shrunk under it: maps PATH the way the shim does (crux_tablemap),
 * looks JOB/PEER up, prints "before found|miss", then waits for a line on stdin (the test
 * truncates the file meanwhile) and looks up again twice: straight on the old mapping (a
 * shrink between refresh and copy: the SIGBUS guard) and through a refresh (the fstat check).
 *
 *   table_shrink PATH JOB PEER
 *
 * Prints "raw found|miss gen=G" and "refreshed found|miss"; exit 0. Killed by SIGBUS
 * before the guard existed. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "crux_tablemap.h"
#include "table_util.h"

static const char *found(int rc)
{
    return rc >= 0 ? "found" : "miss";
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s PATH JOB PEER\n", argv[0]);
        return 2;
    }
    uint8_t peer[16];
    if (parse_peer(argv[3], peer) != 0)
        return 2;
    struct crux_tablemap m = {0};
    struct crux_table_entry e;
    crux_tablemap_refresh(&m, argv[1]);
    printf("before %s\n", found(crux_table_decision(m.table, m.len, argv[2], peer, &e)));
    fflush(stdout);
    char line[16];
    if (fgets(line, sizeof line, stdin) == NULL)
        return 2;
    int raw = crux_table_decision(m.table, m.len, argv[2], peer, &e);
    uint64_t gen = crux_table_generation(m.table);
    printf("raw %s gen=%" PRIu64 " retired=%d\n", found(raw), gen, crux_table_retired(m.table));
    crux_tablemap_refresh(&m, argv[1]);
    printf("refreshed %s\n", found(crux_table_decision(m.table, m.len, argv[2], peer, &e)));
    return 0;
}
