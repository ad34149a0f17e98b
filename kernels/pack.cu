// Strided pack and unpack: move the elements of a 2-D strided view to and from a contiguous staging buffer.
//
// A view is `rows` rows of `cols` elements; row r starts `offset + r * row_stride` elements into the buffer
// (row_stride >= cols). Element i of the staging buffer is element (i / cols, i % cols) of the view. The
// collectives pack a non-contiguous view, run on the staging buffer, and unpack the result back into the view, so
// nothing is lost when the caller's view is not contiguous.
//
// Only the element width matters for a copy, so there is one kernel per width (1, 2, 4, 8 bytes). Each thread
// walks a grid-stride loop; any grid size is correct. Compiled at run time with NVRTC (no headers needed).

template <typename T>
__device__ void pack_view(T* __restrict__ dst, const T* __restrict__ src, unsigned long long offset,
                          unsigned long long rows, unsigned long long cols, unsigned long long row_stride) {
    const unsigned long long total = rows * cols;
    const unsigned long long step = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const unsigned long long r = i / cols;
        const unsigned long long c = i - r * cols;
        dst[i] = src[offset + r * row_stride + c];
    }
}

template <typename T>
__device__ void unpack_view(T* __restrict__ dst, const T* __restrict__ src, unsigned long long offset,
                            unsigned long long rows, unsigned long long cols, unsigned long long row_stride) {
    const unsigned long long total = rows * cols;
    const unsigned long long step = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const unsigned long long r = i / cols;
        const unsigned long long c = i - r * cols;
        dst[offset + r * row_stride + c] = src[i];
    }
}

#define HYPERCOMM_PACK_WIDTH(BYTES, T)                                                                        \
    extern "C" __global__ void hypercomm_pack_##BYTES(T* dst, const T* src, unsigned long long offset,       \
                                                      unsigned long long rows, unsigned long long cols,      \
                                                      unsigned long long row_stride) {                       \
        pack_view<T>(dst, src, offset, rows, cols, row_stride);                                              \
    }                                                                                                         \
    extern "C" __global__ void hypercomm_unpack_##BYTES(T* dst, const T* src, unsigned long long offset,     \
                                                        unsigned long long rows, unsigned long long cols,    \
                                                        unsigned long long row_stride) {                     \
        unpack_view<T>(dst, src, offset, rows, cols, row_stride);                                            \
    }

HYPERCOMM_PACK_WIDTH(1, unsigned char)
HYPERCOMM_PACK_WIDTH(2, unsigned short)
HYPERCOMM_PACK_WIDTH(4, unsigned int)
HYPERCOMM_PACK_WIDTH(8, unsigned long long)
