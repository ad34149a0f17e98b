// Fill and verify: write a known pattern into a device buffer, and count the elements that differ from one.
//
// The pattern is value(i) = a * (i % 61) + b, for integers a and b chosen by the caller. It is exact in every
// element type hypercomm carries as long as |value| stays small (below 2048 for f16 and below 256 for bf16), and
// it composes: if rank r fills with (a=1, b=r), the sum over n ranks is the pattern (a=n, b=n(n-1)/2). So a test
// or a benchmark checks a collective's result on the device, without copying it back, by verifying against the
// pattern the collective must produce.
//
// f16 and bf16 are handled as raw 16-bit patterns converted from float by hand, so no CUDA header is needed and
// NVRTC compiles this file on its own. Kernels use grid-stride loops; any grid size is correct.

__device__ __forceinline__ double hypercomm_pattern(unsigned long long i, long long a, long long b) {
    return (double)(a * (long long)(i % 61ULL) + b);
}

// float -> IEEE half bits, for values that are exactly representable (small integers): no rounding needed.
__device__ __forceinline__ unsigned short hypercomm_f16_bits(float f) {
    const unsigned int x = __float_as_uint(f);
    const unsigned int sign = (x >> 16) & 0x8000u;
    const int exponent = (int)((x >> 23) & 0xffu) - 127 + 15;
    const unsigned int mantissa = x & 0x7fffffu;
    if ((x & 0x7fffffffu) == 0u) {
        return (unsigned short)sign;
    }
    if (exponent <= 0 || exponent >= 31) {
        return (unsigned short)(sign | 0x7c00u); // out of the exact range: an infinity, so verify fails loudly
    }
    return (unsigned short)(sign | ((unsigned int)exponent << 10) | (mantissa >> 13));
}

// float -> bfloat16 bits: the upper half of the float (exact for small integers).
__device__ __forceinline__ unsigned short hypercomm_bf16_bits(float f) {
    return (unsigned short)(__float_as_uint(f) >> 16);
}

template <typename T>
struct Conv {
    __device__ static T from(double v) { return (T)v; }
};

struct F16Tag {};
struct Bf16Tag {};

template <>
struct Conv<F16Tag> {
    __device__ static unsigned short from(double v) { return hypercomm_f16_bits((float)v); }
};
template <>
struct Conv<Bf16Tag> {
    __device__ static unsigned short from(double v) { return hypercomm_bf16_bits((float)v); }
};

template <typename Tag, typename T>
__device__ void fill_pattern(T* __restrict__ data, unsigned long long n, long long a, long long b) {
    const unsigned long long step = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        data[i] = Conv<Tag>::from(hypercomm_pattern(i, a, b));
    }
}

// Counts mismatches into *mismatches and lowers *first_bad to the smallest mismatching index (start it at ~0).
template <typename Tag, typename T>
__device__ void verify_pattern(const T* __restrict__ data, unsigned long long n, long long a, long long b,
                               unsigned long long* mismatches, unsigned long long* first_bad) {
    const unsigned long long step = (unsigned long long)blockDim.x * gridDim.x;
    unsigned long long local = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        if (data[i] != Conv<Tag>::from(hypercomm_pattern(i, a, b))) {
            local += 1;
            atomicMin(first_bad, i);
        }
    }
    if (local != 0) {
        atomicAdd(mismatches, local);
    }
}

#define HYPERCOMM_FILL_VERIFY(NAME, TAG, T)                                                                   \
    extern "C" __global__ void hypercomm_fill_##NAME(T* data, unsigned long long n, long long a, long long b) { \
        fill_pattern<TAG, T>(data, n, a, b);                                                                  \
    }                                                                                                         \
    extern "C" __global__ void hypercomm_verify_##NAME(const T* data, unsigned long long n, long long a,      \
                                                       long long b, unsigned long long* mismatches,           \
                                                       unsigned long long* first_bad) {                       \
        verify_pattern<TAG, T>(data, n, a, b, mismatches, first_bad);                                         \
    }

HYPERCOMM_FILL_VERIFY(f32, float, float)
HYPERCOMM_FILL_VERIFY(f64, double, double)
HYPERCOMM_FILL_VERIFY(f16, F16Tag, unsigned short)
HYPERCOMM_FILL_VERIFY(bf16, Bf16Tag, unsigned short)
HYPERCOMM_FILL_VERIFY(i8, signed char, signed char)
HYPERCOMM_FILL_VERIFY(u8, unsigned char, unsigned char)
HYPERCOMM_FILL_VERIFY(i32, int, int)
HYPERCOMM_FILL_VERIFY(i64, long long, long long)
HYPERCOMM_FILL_VERIFY(u32, unsigned int, unsigned int)
HYPERCOMM_FILL_VERIFY(u64, unsigned long long, unsigned long long)
