// CUDA kernels on logits: greedy token choice per row (sample::Argmax semantics: the largest
// logit, the lowest index on ties). Launcher conventions as in elementwise.h.
#pragma once

#include <cstdint>

namespace dinfer::kernels::cuda {

// tokens[r] = argmax(logits[r, :vocab]); logits f32 [rows, stride].
int ArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int64_t stride, int32_t* tokens,
               void* stream);

}  // namespace dinfer::kernels::cuda
