/* Stand-in for cuda_bf16.h: nccl.h includes it (CUDART_VERSION >= 11000) but
 * uses none of its types in host declarations. See ../regenerate.sh. */
#ifndef HYPERCOMM_STUB_CUDA_BF16_H
#define HYPERCOMM_STUB_CUDA_BF16_H
#endif
