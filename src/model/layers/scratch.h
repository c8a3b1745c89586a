// Scratch: per-forward activation buffers sized for the current number of tokens, reused across
// layers and steps (grown, never shrunk). Owned by one model; not thread-safe.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace dinfer::layers {

struct Scratch {
  Tensor q, k, v, attn, gate, up, act;
  int64_t capacity = 0;

  // Makes every buffer hold at least `tokens` rows of the given widths.
  void Reserve(int64_t tokens, int64_t q_dim, int64_t kv_dim, int64_t intermediate);
};

}  // namespace dinfer::layers
