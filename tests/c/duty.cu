// A GPU workload of known duty cycle: every period, one kernel spins on every SM for
// on_ms, then the host sleeps the rest. Usage: duty ON_MS PERIOD_MS SECONDS
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cuda_runtime.h>

__global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: duty ON_MS PERIOD_MS SECONDS\n");
        return 2;
    }
    double on_ms = atof(argv[1]), period_ms = atof(argv[2]), seconds = atof(argv[3]);
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    long long cycles = (long long)(on_ms * khz);  // kHz x ms = cycles
    int iterations = (int)(seconds * 1000 / period_ms);
    for (int i = 0; i < iterations; i++) {
        spin<<<prop.multiProcessorCount * 4, 256>>>(cycles);
        cudaDeviceSynchronize();
        usleep((useconds_t)((period_ms - on_ms) * 1000));
    }
    return 0;
}
