/*
 * direct_model.c: a two-rank in-place all-reduce of SIZE MiB of floats the way the host backend's direct path runs
 * it (crates/hypercomm-comm/src/backends/host/direct.rs), without hypercomm, to tell the cost of the kernel's copy
 * (process_vm_readv) from the cost of the memory traffic itself.
 *
 * Two threads (the two ranks), each with its own buffer, bound to CPUs 0 and 1. Each pass, after a barrier:
 *   1. each rank reduces its half of both buffers into its own: the peer's half read STEP KiB at a time into a
 *      scratch, then added;
 *   2. barrier; each rank reads the peer's reduced half into its own buffer;
 *   3. barrier.
 * With READ = syscall the peer's bytes come through process_vm_readv on this process (as between the threads of
 * one process, or processes on one host); with READ = memcpy, from the same addresses by memcpy. 40 passes, the
 * first 8 warm up, the median of the others (rank 0's) is printed as busbw (SIZE / time, nccl-tests' all-reduce
 * bus bytes at two ranks).
 *
 *   gcc -O3 -march=native -pthread scripts/direct_model.c -o /tmp/direct_model
 *   /tmp/direct_model 16 256 syscall
 *   /tmp/direct_model 16 256 memcpy
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define PASSES 40
#define WARMUP 8

static size_t S, STEP;
static int use_syscall;
static pid_t pid;
static float *bufs[2];
static _Atomic long arrived[2][16]; /* one cache line per rank */
static pthread_barrier_t start;
static double times[PASSES];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void barrier(long me, long k) {
    atomic_store(&arrived[me][0], k);
    while (atomic_load(&arrived[1 - me][0]) < k) _mm_pause();
}

static void read_peer(void *dst, const void *src, size_t n) {
    if (!use_syscall) {
        memcpy(dst, src, n);
        return;
    }
    struct iovec local = {dst, n}, remote = {(void *)src, n};
    if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != (ssize_t)n) {
        perror("process_vm_readv");
        exit(1);
    }
}

static void *rank(void *arg) {
    long me = (long)arg, k = 0;
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(me, &cpus);
    pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);
    size_t n = S / sizeof(float), half = n / 2, step = STEP / sizeof(float);
    float *buf = aligned_alloc(64, S), *scratch = aligned_alloc(64, STEP);
    bufs[me] = buf;
    for (int p = 0; p < PASSES; p++) {
        for (size_t i = 0; i < n; i++) buf[i] = 1.0f;
        pthread_barrier_wait(&start);
        double t0 = now();
        float *peer = bufs[1 - me], *own = buf + me * half;
        for (size_t o = 0; o < half; o += step) {
            size_t m = half - o < step ? half - o : step;
            read_peer(scratch, peer + me * half + o, m * sizeof(float));
            for (size_t i = 0; i < m; i++) own[o + i] += scratch[i];
        }
        barrier(me, ++k);
        read_peer(buf + (1 - me) * half, peer + (1 - me) * half, half * sizeof(float));
        barrier(me, ++k);
        times[p] = now() - t0;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[3], "syscall") && strcmp(argv[3], "memcpy"))) {
        fprintf(stderr, "usage: %s SIZE_MiB STEP_KiB syscall|memcpy\n", argv[0]);
        return 2;
    }
    S = (size_t)atoi(argv[1]) << 20;
    STEP = (size_t)atoi(argv[2]) << 10;
    use_syscall = !strcmp(argv[3], "syscall");
    pid = getpid();
    pthread_barrier_init(&start, NULL, 2);
    pthread_t th[2];
    for (long i = 0; i < 2; i++) pthread_create(&th[i], NULL, rank, (void *)i);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    qsort(times + WARMUP, PASSES - WARMUP, sizeof(double), cmp);
    double t = times[WARMUP + (PASSES - WARMUP) / 2];
    printf("all_reduce %zu MiB, %s, steps of %zu KiB: median %.3f ms, busbw %.2f GB/s\n", S >> 20, argv[3],
           STEP >> 10, t * 1e3, S / t / 1e9);
    return 0;
}
