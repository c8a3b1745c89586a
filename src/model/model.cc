#include "model/model.h"

namespace dinfer {

KvStorage::KvStorage(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_dim)
    : num_blocks_(num_blocks), block_size_(block_size), kv_dim_(kv_dim) {
  for (int64_t i = 0; i < num_layers; ++i) {
    k_.push_back(Tensor::Zeros(DType::kF32, {num_blocks, block_size, kv_dim}));
    v_.push_back(Tensor::Zeros(DType::kF32, {num_blocks, block_size, kv_dim}));
  }
}

ops::KvLayerView KvStorage::layer(int64_t i) const {
  return ops::KvLayerView{k_[i].data<float>(), v_[i].data<float>()};
}

}  // namespace dinfer
