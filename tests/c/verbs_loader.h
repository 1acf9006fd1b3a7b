/*
 * verbs_loader.h - what the verbs test programs share (rc_pair.c, rdma_stream.c): opening
 * libibverbs and resolving verbs the way NCCL does (src/misc/ibvsymbols.cc), and "--name value"
 * arguments. The including program defines DIE(fmt, ...) (print, exit 1) first.
 *
 * -DNCCL_LOADER picks the NCCL generation whose dlopen() order is reproduced:
 *   229 (NCCL <= 2.29): "libibverbs.so", else "libibverbs.so.1", by name;
 *   230 (NCCL >= 2.30, the default): $NCCL_IBVERBS_LIB first, then the names.
 */
#ifndef CRUX_TEST_VERBS_LOADER_H
#define CRUX_TEST_VERBS_LOADER_H

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#ifndef NCCL_LOADER
#define NCCL_LOADER 230
#endif

static inline void *open_verbs(void)
{
    void *h = NULL;
#if NCCL_LOADER >= 230
    const char *lib = getenv("NCCL_IBVERBS_LIB");
    if (lib != NULL && lib[0] != '\0')
        h = dlopen(lib, RTLD_NOW);
#endif
    if (h == NULL)
        h = dlopen("libibverbs.so", RTLD_NOW);
    if (h == NULL)
        h = dlopen("libibverbs.so.1", RTLD_NOW);
    if (h == NULL)
        DIE("dlopen(libibverbs.so[.1]): %s", dlerror());
    return h;
}

/* A verb at NCCL's version; a library that lacks one fails here as it would fail NCCL. */
static inline void *sym(void *h, const char *name)
{
    void *p = dlvsym(h, name, "IBVERBS_1.1");
    if (p == NULL)
        DIE("dlvsym(%s, IBVERBS_1.1): %s", name, dlerror());
    return p;
}

static inline long arg(int argc, char **argv, const char *name, long dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return strtol(argv[i + 1], NULL, 0);
    return dflt;
}

static inline const char *sarg(int argc, char **argv, const char *name, const char *dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return argv[i + 1];
    return dflt;
}

#endif /* CRUX_TEST_VERBS_LOADER_H */
