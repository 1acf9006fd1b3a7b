/*
 * crux_rates.c - the trace simulator's rate solver (cruxd/sim/rates.py), in C.
 *
 * Strict priority between levels, max-min fair progressive filling within one, over
 * entities (a job's collective) that load each link with rate * weight. It is the
 * numpy reference (rates.py, _allocate_numpy) step for step and in the same floating-
 * point order, so both give the same doubles: a link's load adds the active entities'
 * weights in entity order (the reference's np.add.accumulate), and the build turns FMA
 * contraction off (setup.py). tests/test_sim_rates_native.py checks the two agree bit for
 * bit. It exists for speed only: the simulator's ECMP-path runs spent most of their
 * time in numpy's per-call overhead on problems of ~10 entities and ~50 links.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EPS 1e-12

/* weights: n x links, row-major; capacity: links; level: n (larger = served first);
 * rate: n, written. Returns 0, or -1 if out of memory (rate untouched then). An entity
 * with no link gets +inf. */
__attribute__((visibility("default")))
int crux_rates_allocate(const double *weights, int64_t n, int64_t links,
                        const double *capacity, const double *level, double *rate)
{
    if (n <= 0)
        return 0;
    double *residual = malloc(sizeof(double) * (size_t)(links > 0 ? links : 1));
    double *load = malloc(sizeof(double) * (size_t)(links > 0 ? links : 1));
    unsigned char *full = malloc((size_t)(links > 0 ? links : 1));
    unsigned char *active = malloc((size_t)n);
    unsigned char *linked = malloc((size_t)n);
    unsigned char *done = malloc((size_t)n); /* its level has been served */
    if (!residual || !load || !full || !active || !linked || !done) {
        free(residual); free(load); free(full); free(active); free(linked); free(done);
        return -1;
    }
    memcpy(residual, capacity, sizeof(double) * (size_t)links);
    for (int64_t i = 0; i < n; i++) {
        const double *w = weights + i * links;
        linked[i] = 0;
        for (int64_t e = 0; e < links; e++)
            if (w[e] > 0) { linked[i] = 1; break; }
        rate[i] = linked[i] ? 0.0 : INFINITY;
        /* a NaN level equals none, so the reference never serves it (rate 0); here it
         * would never be marked served either, and the level loop would not end */
        done[i] = !linked[i] || isnan(level[i]);
    }
    for (;;) {
        /* the highest level not served yet */
        int found = 0;
        double lv = 0;
        for (int64_t i = 0; i < n; i++)
            if (!done[i] && (!found || level[i] > lv)) { lv = level[i]; found = 1; }
        if (!found)
            break;
        int64_t left = 0;
        for (int64_t i = 0; i < n; i++) {
            active[i] = !done[i] && level[i] == lv;
            if (active[i]) { done[i] = 1; left++; }
        }
        while (left > 0) {
            int any = 0;
            for (int64_t i = 0; i < n; i++) {
                if (!active[i])
                    continue;
                const double *w = weights + i * links;
                if (!any)
                    memcpy(load, w, sizeof(double) * (size_t)links);
                else
                    for (int64_t e = 0; e < links; e++)
                        load[e] = load[e] + w[e];
                any = 1;
            }
            double inc = INFINITY;
            for (int64_t e = 0; e < links; e++) {
                if (load[e] > EPS) {
                    double s = (residual[e] > 0.0 ? residual[e] : 0.0) / load[e];
                    if (s < inc)
                        inc = s;
                }
            }
            if (isinf(inc)) { /* weights too small to fill anything: nothing limits them */
                for (int64_t i = 0; i < n; i++)
                    if (active[i]) rate[i] = INFINITY;
                break;
            }
            double bound = inc * (1 + 1e-9) + EPS;
            for (int64_t i = 0; i < n; i++)
                if (active[i]) rate[i] = rate[i] + inc;
            for (int64_t e = 0; e < links; e++) {
                full[e] = 0;
                if (load[e] > EPS) {
                    double s = (residual[e] > 0.0 ? residual[e] : 0.0) / load[e];
                    residual[e] = residual[e] - inc * load[e];
                    full[e] = s <= bound;
                }
            }
            for (int64_t i = 0; i < n; i++) {
                if (!active[i])
                    continue;
                const double *w = weights + i * links;
                for (int64_t e = 0; e < links; e++)
                    if (full[e] && w[e] > 0) { active[i] = 0; left--; break; }
            }
        }
    }
    free(residual); free(load); free(full); free(active); free(linked); free(done);
    return 0;
}
