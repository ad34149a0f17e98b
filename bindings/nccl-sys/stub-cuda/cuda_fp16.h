/* Stand-in for cuda_fp16.h: nccl.h includes it but uses none of its types in
 * host declarations. See ../regenerate.sh. */
#ifndef HYPERCOMM_STUB_CUDA_FP16_H
#define HYPERCOMM_STUB_CUDA_FP16_H
#endif
