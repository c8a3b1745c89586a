// Workspace: activation buffers of one model's forward pass, addressed by slot number and reused
// across layers and steps (grown, never shrunk). Each user numbers its own slots: hyper-connections
// from 0, MoE from 100, attention from 200, the model itself from 300. Owned by one model; not
// thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace dinfer::layers {

class Workspace {
 public:
  // A [rows, cols] view of the slot's buffer, valid until the slot is asked for more elements.
  TensorView Get(int slot, int64_t rows, int64_t cols, DType dtype = DType::kF32);

 private:
  std::vector<Tensor> buffers_;
};

}  // namespace dinfer::layers
