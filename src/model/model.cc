#include "model/model.h"

namespace dinfer {

KvStorage::KvStorage(const KvLayout& layout, int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  for (const auto& planes : layout) {
    planes_.emplace_back();
    for (const KvPlane& p : planes) {
      planes_.back().push_back(Tensor::Zeros(DType::kF32, {num_blocks, p.rows_per_block, p.width}));
    }
  }
}

ops::KvLayerView KvStorage::layer(int64_t i) const {
  return ops::KvLayerView{planes_[i][0].data<float>(), planes_[i][1].data<float>()};
}

int64_t KvStorage::BytesPerBlock(const KvLayout& layout) {
  int64_t bytes = 0;
  for (const auto& planes : layout) {
    for (const KvPlane& p : planes) {
      bytes += p.rows_per_block * p.width * static_cast<int64_t>(sizeof(float));
    }
  }
  return bytes;
}

Status Model::ForwardDraft(const ops::OpContext& ctx, const ForwardInput& in, const KvStorage& kv,
                           const TensorView& logits) {
  return Unimplemented("architecture '{}' has no draft (MTP) layer", config_.arch);
}

KvLayout Model::KvLayoutFor(int64_t block_size) const {
  const KvPlane plane{block_size, kv_dim()};
  return KvLayout(static_cast<size_t>(config_.num_layers), {plane, plane});
}

}  // namespace dinfer
