#include "model/layers/scratch.h"

namespace dinfer::layers {

void Scratch::Reserve(int64_t tokens, int64_t q_dim, int64_t kv_dim, int64_t intermediate) {
  if (tokens <= capacity && !q.empty() && q.view().cols() == q_dim && k.view().cols() == kv_dim &&
      gate.view().cols() == intermediate) {
    return;
  }
  const int64_t n = std::max(tokens, capacity);
  q = Tensor::Empty(DType::kF32, {n, q_dim});
  k = Tensor::Empty(DType::kF32, {n, kv_dim});
  v = Tensor::Empty(DType::kF32, {n, kv_dim});
  attn = Tensor::Empty(DType::kF32, {n, q_dim});
  gate = Tensor::Empty(DType::kF32, {n, intermediate});
  up = Tensor::Empty(DType::kF32, {n, intermediate});
  act = Tensor::Empty(DType::kF32, {n, intermediate});
  capacity = n;
}

}  // namespace dinfer::layers
