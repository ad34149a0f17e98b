/*
 * mailbox.c: the fastest a two-rank host sendrecv could run through shared-memory mailboxes, measured without
 * hypercomm, against one copy and against two copies through a private buffer.
 *
 * Two threads (the two ranks), bound to CPUs 0 and 1, each send 16 MiB to the other and receive 16 MiB from it, as
 * the shm transport's sendrecv does: each direction has SLOTS slots of PIECE KiB; the sender copies a piece into a
 * free slot and publishes it (`sent`), the receiver copies it out and frees the slot (`taken`); both spin, and each
 * moves its send and its receive as far as the slots let it. The median of 30 passes (rank 0's) is printed as
 * 16 MiB / time, which is the sendrecv's busbw. Then, for reference, each thread alone: 16 MiB copied once
 * (memcpy) and copied twice through a private 64 KiB buffer (no other core involved).
 *
 *   gcc -O2 -pthread scripts/mailbox.c -o /tmp/mailbox
 *   /tmp/mailbox 64 1      # 64 KiB pieces, one slot a direction (the transport's mailbox)
 *   /tmp/mailbox 256 4
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>

#define SIZE (16u << 20)
#define BOUNCE (64u << 10)
#define PASSES 30

/* One direction's mailbox: `sent` written by the sender, `taken` by the receiver, each on a line of its own, and
 * the slots' address (written once) on a third. */
struct mailbox {
    _Alignas(64) atomic_ulong sent;
    _Alignas(64) atomic_ulong taken;
    _Alignas(64) char *slots;
};

static unsigned piece, nslots;
static struct mailbox boxes[2]; /* boxes[r]: from rank r to the other */
static pthread_barrier_t barrier;
static double exchange_gbps, copy_gbps[2], bounce_gbps[2];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_gbps(double *t) {
    qsort(t, PASSES, sizeof t[0], by_value);
    return SIZE / t[PASSES / 2] / 1e9;
}

static void *rank(void *arg) {
    long me = (long)arg;
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(me, &cpus);
    pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);
    char *src = malloc(SIZE), *dst = malloc(SIZE), *bounce = aligned_alloc(64, BOUNCE);
    memset(src, 1, SIZE);
    memset(dst, 0, SIZE);
    struct mailbox *out = &boxes[me], *in = &boxes[1 - me];
    unsigned long pieces = SIZE / piece;
    double t[PASSES];
    for (int p = 0; p < PASSES; p++) {
        pthread_barrier_wait(&barrier);
        atomic_store(&out->sent, 0);
        atomic_store(&in->taken, 0);
        pthread_barrier_wait(&barrier);
        double start = now();
        unsigned long s = 0, r = 0;
        while (s < pieces || r < pieces) {
            unsigned long before = s + r;
            while (s < pieces && s - atomic_load_explicit(&out->taken, memory_order_acquire) < nslots) {
                memcpy(out->slots + (s % nslots) * piece, src + s * piece, piece);
                atomic_store_explicit(&out->sent, ++s, memory_order_release);
            }
            while (r < pieces && atomic_load_explicit(&in->sent, memory_order_acquire) > r) {
                memcpy(dst + r * piece, in->slots + (r % nslots) * piece, piece);
                atomic_store_explicit(&in->taken, ++r, memory_order_release);
            }
            if (s + r == before)
                _mm_pause(); /* nothing could move: wait without hammering the peer's lines */
        }
        t[p] = now() - start;
    }
    if (me == 0)
        exchange_gbps = median_gbps(t);
    for (int p = 0; p < PASSES; p++) {
        pthread_barrier_wait(&barrier);
        double start = now();
        memcpy(dst, src, SIZE);
        t[p] = now() - start;
    }
    copy_gbps[me] = median_gbps(t);
    for (int p = 0; p < PASSES; p++) {
        pthread_barrier_wait(&barrier);
        double start = now();
        for (unsigned i = 0; i < SIZE; i += BOUNCE) {
            memcpy(bounce, src + i, BOUNCE);
            memcpy(dst + i, bounce, BOUNCE);
        }
        t[p] = now() - start;
    }
    bounce_gbps[me] = median_gbps(t);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3 || atoi(argv[1]) <= 0 || atoi(argv[2]) <= 0 || ((unsigned)atoi(argv[1]) << 10) > SIZE) {
        fprintf(stderr, "usage: %s PIECE_KIB SLOTS\n", argv[0]);
        return 2;
    }
    piece = (unsigned)atoi(argv[1]) << 10;
    nslots = (unsigned)atoi(argv[2]);
    for (int i = 0; i < 2; i++) {
        boxes[i].slots = aligned_alloc(4096, (size_t)piece * nslots);
        memset(boxes[i].slots, 0, (size_t)piece * nslots);
    }
    pthread_t threads[2];
    pthread_barrier_init(&barrier, NULL, 2);
    for (long i = 0; i < 2; i++)
        pthread_create(&threads[i], NULL, rank, (void *)i);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    printf("sendrecv through mailboxes of %u x %u KiB: %.2f GB/s\n", nslots, piece >> 10, exchange_gbps);
    printf("each rank alone: one copy %.2f / %.2f GB/s, two copies through 64 KiB %.2f / %.2f GB/s\n",
           copy_gbps[0], copy_gbps[1], bounce_gbps[0], bounce_gbps[1]);
    return 0;
}
