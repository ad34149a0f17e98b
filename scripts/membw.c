/*
 * membw.c: what the machine's memory allows a two-rank host all-reduce, measured without hypercomm.
 *
 * Each of THREADS threads owns a buffer of SIZE MiB and, after a barrier, passes over it 40 times; the first 8
 * passes warm up and the median of the other 32 (thread 0's) is printed as SIZE / time. Modes:
 *   0  in place: buf[i] += 1 (reads and writes every byte once: the least memory traffic of an in-place
 *      all-reduce, per rank)
 *   1  memcpy to a second buffer of the same size
 * A fourth argument `huge` aligns the buffers to 2 MiB and asks the kernel to back them with 2 MiB pages
 * (madvise MADV_HUGEPAGE) before they are first touched, as hypercomm_comm::host_buffer::huge_page_vec does.
 *
 * Build and run (docs/perf/host-collectives.md quotes these):
 *   gcc -O3 -march=native -pthread scripts/membw.c -o /tmp/membw
 *   /tmp/membw 16 0 2     # 16 MiB, in place, two threads
 *   /tmp/membw 16 0 2 huge
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define PASSES 40
#define WARMUP 8
#define TIMED (PASSES - WARMUP)

static size_t size_bytes;
static int mode;
static int huge;
static pthread_barrier_t start_line;
static double timings[2][TIMED];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *pass(void *arg) {
    int id = (int)(intptr_t)arg;
    size_t align = huge ? (size_t)2 << 20 : 4096;
    size_t rounded = (size_bytes + align - 1) / align * align;
    float *buf = aligned_alloc(align, rounded);
    float *dst = aligned_alloc(align, rounded);
    if (!buf || !dst) {
        fprintf(stderr, "membw: cannot allocate %zu bytes\n", size_bytes);
        exit(1);
    }
    if (huge && (madvise(buf, rounded, MADV_HUGEPAGE) || madvise(dst, rounded, MADV_HUGEPAGE))) {
        perror("membw: madvise(MADV_HUGEPAGE)");
        exit(1);
    }
    memset(buf, 0, size_bytes);
    memset(dst, 0, size_bytes);
    size_t n = size_bytes / sizeof(float);
    for (int it = 0; it < PASSES; it++) {
        pthread_barrier_wait(&start_line);
        double t0 = now();
        if (mode == 0) {
            for (size_t i = 0; i < n; i++) buf[i] += 1.0f;
        } else {
            memcpy(dst, buf, size_bytes);
        }
        double t = now() - t0;
        if (it >= WARMUP) timings[id][it - WARMUP] = t;
    }
    free(buf);
    free(dst);
    return NULL;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 4 && !(argc == 5 && strcmp(argv[4], "huge") == 0)) {
        fprintf(stderr, "usage: membw SIZE_MIB MODE(0 in place, 1 memcpy) THREADS(1 or 2) [huge]\n");
        return 2;
    }
    huge = argc == 5;
    size_bytes = (size_t)atol(argv[1]) << 20;
    mode = atoi(argv[2]);
    int threads = atoi(argv[3]);
    if (size_bytes == 0 || (mode != 0 && mode != 1) || threads < 1 || threads > 2) {
        fprintf(stderr, "membw: bad arguments (size > 0 MiB, mode 0 or 1, 1 or 2 threads)\n");
        return 2;
    }
    pthread_barrier_init(&start_line, NULL, threads);
    pthread_t th[2];
    for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, pass, (void *)(intptr_t)i);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    qsort(timings[0], TIMED, sizeof(double), by_value);
    double median = timings[0][TIMED / 2];
    printf("%zu MiB %s, %d thread(s)%s: median %.3f ms, %.2f GB/s (size / time)\n", size_bytes >> 20,
           mode == 0 ? "in place" : "memcpy", threads, huge ? ", 2 MiB pages advised" : "", median * 1e3,
           size_bytes / median / 1e9);
    return 0;
}
