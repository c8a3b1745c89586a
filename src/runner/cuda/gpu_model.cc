#include "runner/cuda/gpu_model.h"

namespace dinfer {

KvLayout GpuModel::KvLayoutFor(int64_t block_size, DType kv_dtype) const {
  const KvPlane plane{block_size, config_.num_kv_heads * config_.head_dim, 0, kv_dtype};
  return KvLayout(static_cast<size_t>(config_.num_layers), {plane, plane});
}

std::vector<KvGroup> GpuModel::KvGroupsFor(int64_t block_size) const {
  return {KvGroup{"full", block_size, 0, 1}};
}

}  // namespace dinfer
