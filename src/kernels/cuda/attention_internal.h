// Kernels behind AttentionRows (attention.h), shared between its .cu files.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/attention.h"

namespace dinfer::kernels::cuda {

// The tensor-core kernel for bf16 and head_dim 64 or 128 (PrefillSupports); writes the output
// (*merged: its splits were merged in a cluster), or with num_splits > 1 the split workspace for
// the merge kernel.
cudaError_t AttentionDecodeMma(const AttentionParams& p, cudaStream_t stream, bool* merged);
// Its CTAs per (row, split) and per SM for num_rows rows.
AttentionRowsShape AttentionDecodeMmaShape(int64_t num_rows, int64_t head_dim, bool kv_fp8,
                                           int64_t num_heads, int64_t num_kv_heads);

}  // namespace dinfer::kernels::cuda
