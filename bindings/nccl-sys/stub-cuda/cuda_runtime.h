/* Stand-in for the CUDA runtime header, used only to run bindgen over nccl.h
 * without a CUDA toolkit (see ../regenerate.sh). nccl.h needs exactly two
 * things from it: the CUDART_VERSION macro (which gates the bf16/fp8 includes)
 * and the opaque stream handle type used by every collective. The real
 * definition in driver_types.h is the same pointer-to-incomplete-struct, so
 * the generated Rust type has the real ABI. The real header also brings in
 * <stddef.h>, on which nccl.h relies for size_t. */
#ifndef HYPERCOMM_STUB_CUDA_RUNTIME_H
#define HYPERCOMM_STUB_CUDA_RUNTIME_H

#include <stddef.h>

#define CUDART_VERSION 13000

typedef struct CUstream_st *cudaStream_t;

#endif
