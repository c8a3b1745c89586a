#include "model/model.h"

#include <algorithm>

#include "base/logging.h"

namespace dinfer {

KvStorage::KvStorage(const KvLayout& layout, std::vector<int64_t> num_blocks, int64_t block_size)
    : num_blocks_(std::move(num_blocks)), block_size_(block_size) {
  for (const auto& planes : layout) {
    planes_.emplace_back();
    for (const KvPlane& p : planes) {
      planes_.back().push_back(Tensor::Zeros(
          p.dtype, {num_blocks_.at(static_cast<size_t>(p.group)), p.rows_per_block, p.width}));
    }
  }
}

StatusOr<KvCacheDType> ParseKvCacheDType(std::string_view name) {
  if (name == "auto") return KvCacheDType::kAuto;
  if (name == "f32") return KvCacheDType::kF32;
  if (name == "bf16") return KvCacheDType::kBF16;
  if (name == "fp8" || name == "fp8_e4m3") return KvCacheDType::kFp8;
  return InvalidArgument("KV cache dtype '{}': use auto, f32, bf16 or fp8", name);
}

StatusOr<KvLayout> ApplyKvCacheDType(KvLayout layout, KvCacheDType dtype, std::string_view arch) {
  if (dtype == KvCacheDType::kFp8) {
    // DeepSeek-V4's kernels read FP8 rows on the CPU: its bf16 planes (window keys, compressed
    // entries, indexer keys) whose width is a multiple of the FP8 block become FP8.
    if (arch != "deepseek_v4") {
      return InvalidArgument(
          "an FP8 KV cache needs the CUDA runner (--device cuda), except for DeepSeek-V4");
    }
    for (auto& planes : layout) {
      for (KvPlane& p : planes) {
        if (p.dtype == DType::kBF16 && p.width % BlockSize(DType::kF8E4M3B32) == 0) {
          p.dtype = DType::kF8E4M3B32;
        }
      }
    }
    return layout;
  }
  bool any_bf16 = false;
  for (auto& planes : layout) {
    for (KvPlane& p : planes) {
      if (dtype == KvCacheDType::kF32) p.dtype = DType::kF32;
      any_bf16 = any_bf16 || p.dtype == DType::kBF16;
    }
  }
  if (dtype == KvCacheDType::kBF16 && !any_bf16) {
    return InvalidArgument(
        "architecture '{}' keeps its KV cache in f32 on the CPU: use auto or f32", arch);
  }
  return layout;
}

ops::KvLayerView KvStorage::layer(int64_t i) const {
  DINFER_CHECK(planes_[i][0].view().dtype == DType::kF32 &&
               planes_[i][1].view().dtype == DType::kF32);
  return ops::KvLayerView{planes_[i][0].data<float>(), planes_[i][1].data<float>()};
}

int64_t KvStorage::BytesPerBlock(const KvLayout& layout) {
  int64_t bytes = 0;
  for (const auto& planes : layout) {
    for (const KvPlane& p : planes) {
      bytes += p.rows_per_block * RowBytes(p.dtype, p.width);
    }
  }
  return bytes;
}

std::vector<int64_t> KvStorage::GroupBytesPerBlock(const KvLayout& layout, int64_t num_groups) {
  std::vector<int64_t> bytes(static_cast<size_t>(num_groups), 0);
  for (const auto& planes : layout) {
    for (const KvPlane& p : planes) {
      bytes.at(static_cast<size_t>(p.group)) += p.rows_per_block * RowBytes(p.dtype, p.width);
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
