#include "model/model.h"

#include <algorithm>

namespace dinfer {

KvStorage::KvStorage(const KvLayout& layout, std::vector<int64_t> num_blocks, int64_t block_size)
    : num_blocks_(std::move(num_blocks)), block_size_(block_size) {
  for (const auto& planes : layout) {
    planes_.emplace_back();
    for (const KvPlane& p : planes) {
      planes_.back().push_back(Tensor::Zeros(
          DType::kF32, {num_blocks_.at(static_cast<size_t>(p.group)), p.rows_per_block, p.width}));
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

std::vector<int64_t> KvStorage::GroupBytesPerBlock(const KvLayout& layout, int64_t num_groups) {
  std::vector<int64_t> bytes(static_cast<size_t>(num_groups), 0);
  for (const auto& planes : layout) {
    for (const KvPlane& p : planes) {
      bytes.at(static_cast<size_t>(p.group)) +=
          p.rows_per_block * p.width * static_cast<int64_t>(sizeof(float));
    }
  }
  return bytes;
}

Status Model::ForwardDraft(const ops::OpContext& ctx, const ForwardInput& in, const KvStorage& kv,
                           const TensorView& logits) {
  return Unimplemented("architecture '{}' has no draft (MTP) layer", config_.arch);
}

std::vector<KvGroup> Model::KvGroupsFor(int64_t block_size) const {
  const ModelConfig& c = config_;
  const bool all_sliding =
      c.sliding_window > 0 &&
      std::all_of(c.layer_sliding.begin(), c.layer_sliding.end(), [](bool b) { return b; });
  if (all_sliding) return {KvGroup{"window", block_size, c.sliding_window, 1}};
  return {KvGroup{"full", block_size, 0, 1}};
}

KvLayout Model::KvLayoutFor(int64_t block_size) const {
  const KvPlane plane{block_size, kv_dim()};
  return KvLayout(static_cast<size_t>(config_.num_layers), {plane, plane});
}

}  // namespace dinfer
