/*
 * floors.c: the fastest a two-rank host collective could run on this machine if it moved only the memory traffic
 * it cannot avoid, measured without hypercomm, as busbw (nccl-tests' bus bytes / time) for a SIZE MiB benchmark
 * size (the size `hypercomm bench --sizes` takes).
 *
 * Two threads (the two ranks), each with its own buffers, after a barrier pass over them 40 times; the first 8
 * passes warm up and the median of the other 32 (thread 0's) is reported. Per rank, with S = SIZE:
 *   all_reduce      in place over S bytes: read S, write S                       busbw = S / t
 *   all_gather      read S/2 (its input), write S (the output, non-temporal)     busbw = (S/2) / t
 *   reduce_scatter  read S (its input: two halves, summed), write S/2            busbw = (S/2) / t
 *                   (the output written with ordinary stores, and again with non-temporal ones, which skip
 *                   reading the output's lines first; both are printed)
 * No rank reads what the other wrote, so the exchange itself (lines crossing between cores) costs nothing here:
 * these are upper bounds, and a collective that reaches some fraction of its own floor is doing as well as one
 * that reaches the same fraction of another's.
 *
 *   gcc -O3 -march=native -pthread scripts/floors.c -o /tmp/floors
 *   /tmp/floors 16
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PASSES 40
#define WARMUP 8
#define TIMED (PASSES - WARMUP)

static size_t S;
static int op;
static pthread_barrier_t bar;
static double times[TIMED];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Non-temporal copy of n floats (n a multiple of 8, dst 32-byte aligned). */
static void stream(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
}

static void *rank(void *arg) {
    long me = (long)arg;
    size_t n = S / sizeof(float);
    float *a = aligned_alloc(64, S), *b = aligned_alloc(64, S);
    for (size_t i = 0; i < n; i++) a[i] = 1.0f, b[i] = 0.0f;
    for (int p = 0; p < PASSES; p++) {
        pthread_barrier_wait(&bar);
        double t0 = now();
        if (op == 0) {
            for (size_t i = 0; i < n; i++) a[i] += 1.0f;
        } else if (op == 1) {
            stream(b, a, n / 2);
            stream(b + n / 2, a, n / 2);
            _mm_sfence();
        } else if (op == 2) {
            for (size_t i = 0; i < n / 2; i++) b[i] = a[i] + a[i + n / 2];
        } else {
            for (size_t i = 0; i < n / 2; i += 8)
                _mm256_stream_ps(b + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(a + i + n / 2)));
            _mm_sfence();
        }
        double t = now() - t0;
        if (me == 0 && p >= WARMUP) times[p - WARMUP] = t;
        if (op == 0) for (size_t i = 0; i < n; i++) a[i] = 1.0f; /* keep values bounded, as the bench does */
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SIZE_MiB\n", argv[0]);
        return 2;
    }
    S = (size_t)atol(argv[1]) << 20;
    const char *names[] = {"all_reduce", "all_gather", "reduce_scatter", "reduce_scatter_nt"};
    const double bus[] = {1.0, 0.5, 0.5, 0.5};
    for (op = 0; op < 4; op++) {
        pthread_t t[2];
        pthread_barrier_init(&bar, NULL, 2);
        for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, rank, (void *)i);
        for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
        pthread_barrier_destroy(&bar);
        qsort(times, TIMED, sizeof times[0], cmp);
        double med = times[TIMED / 2];
        printf("%-15s %s MiB: median %.3f ms, floor busbw %.2f GB/s\n", names[op], argv[1], med * 1e3,
               bus[op] * S / med / 1e9);
    }
    return 0;
}
