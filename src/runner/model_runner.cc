#include "runner/model_runner.h"

#include <algorithm>

#ifdef DINFER_WITH_CUDA
#include "backend/cuda/device.h"
#include "model/archs/deepseek_v4.h"
#include "model/layers/decoder.h"
#include "runner/cuda/gpu_decoder.h"
#include "runner/cuda/gpu_deepseek_v4.h"
#include "runner/cuda/gpu_runner.h"
#endif

namespace dinfer {

#ifndef DINFER_WITH_CUDA
class GpuRunner {};  // this build has no CUDA backend
#endif

namespace {

// The CPU KV layout as the options store it: the model's own when the dtype they ask for does not
// apply to it (ModelRunner reports why).
KvLayout CpuKvLayout(const Model& model, const RunnerOptions& o) {
  KvLayout layout = model.KvLayoutFor(o.block_size);
  StatusOr<KvLayout> stored = ApplyKvCacheDType(layout, o.kv_cache_dtype, model.config().arch);
  return stored.ok() ? std::move(*stored) : layout;
}

int64_t BlocksFor(const RunnerOptions& o) {
  if (o.num_blocks > 0) return o.num_blocks;
  return (o.max_seq_len + o.block_size - 1) / o.block_size;
}

std::vector<int64_t> GroupBlocks(const RunnerOptions& o, size_t num_groups) {
  if (!o.group_num_blocks.empty()) return o.group_num_blocks;
  return std::vector<int64_t>(num_groups, BlocksFor(o));
}

// Blocks of a group holding rows of a sequence's first n tokens.
int64_t GroupBlocksFor(const KvGroup& g, int64_t n) {
  const int64_t rows = n / g.entry_rate, per_block = g.block_size / g.entry_rate;
  return (rows + per_block - 1) / per_block;
}

StatusOr<std::unique_ptr<GpuRunner>> MakeGpuRunner(const Model& model, const RunnerOptions& o) {
#ifdef DINFER_WITH_CUDA
  if (cuda::DeviceCount() == 0) {
    return MakeError(StatusCode::kFailedPrecondition, "no CUDA device is visible");
  }
  std::unique_ptr<GpuModel> gpu_model;
  if (const auto* decoder = dynamic_cast<const layers::DecoderModel*>(&model)) {
    DINFER_ASSIGN_OR_RETURN(auto d, GpuDecoder::Upload(*decoder, o.cuda_dtype));
    if (o.cuda_fp8_weights) DINFER_RETURN_IF_ERROR(d->QuantizeWeightsFp8());
    gpu_model = std::move(d);
  } else if (const auto* v4 = dynamic_cast<const DeepseekV4Model*>(&model)) {
    if (o.cuda_dtype != DType::kBF16 || o.cuda_fp8_weights) {
      return Unimplemented("DeepSeek-V4 on CUDA runs with bf16 weights");
    }
    if (o.kv_cache_dtype != KvCacheDType::kAuto && o.kv_cache_dtype != KvCacheDType::kBF16) {
      return Unimplemented("DeepSeek-V4 on CUDA keeps its KV cache in bf16");
    }
    DINFER_ASSIGN_OR_RETURN(gpu_model, GpuDeepseekV4::Upload(*v4));
  } else {
    return Unimplemented("architecture '{}' has no CUDA forward pass", model.config().arch);
  }
  GpuRunnerOptions g;
  g.num_blocks = BlocksFor(o);
  g.group_num_blocks = o.group_num_blocks;
  g.block_size = o.block_size;
  g.max_seq_len = o.max_seq_len;
  g.max_num_tokens = o.max_num_tokens;
  g.max_num_seqs = o.max_num_seqs;
  if (o.kv_cache_dtype == KvCacheDType::kF32) {
    return InvalidArgument("the CUDA KV cache is bf16 or fp8, not f32");
  }
  g.kv_cache_dtype = o.kv_cache_dtype == KvCacheDType::kFp8 ? DType::kF8E4M3 : DType::kBF16;
  g.kv_scale = o.kv_scale;
  return GpuRunner::Create(std::move(gpu_model), g);
#else
  return Unimplemented("this build has no CUDA backend (configure with -DDINFER_CUDA=ON)");
#endif
}

}  // namespace

bool ModelRunner::CudaAvailable() {
#ifdef DINFER_WITH_CUDA
  return cuda::DeviceCount() > 0;
#else
  return false;
#endif
}

Status ModelRunner::CheckQuantization(std::string_view name, Device device) {
  if (name == "none") return OkStatus();
  if (name != "fp8") return InvalidArgument("quantization '{}': use none or fp8", name);
  if (device != Device::kCuda) {
    return InvalidArgument("--quantization fp8 needs the CUDA runner (--device cuda)");
  }
  return OkStatus();
}

StatusOr<Device> ModelRunner::ParseDevice(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  if (name == "auto") return CudaAvailable() ? Device::kCuda : Device::kCpu;
  return InvalidArgument("device '{}': use cpu, cuda or auto", name);
}

std::vector<int64_t> ModelRunner::KvBytesPerBlock(const Model& model, const RunnerOptions& o) {
  if (o.device == Device::kCpu) {
    return KvStorage::GroupBytesPerBlock(
        CpuKvLayout(model, o), static_cast<int64_t>(model.KvGroupsFor(o.block_size).size()));
  }
  const ModelConfig& c = model.config();
  const std::vector<KvGroup> groups = model.KvGroupsFor(o.block_size);
  if (groups.size() > 1) {  // the model's own planes (DeepSeek-V4: bf16 keys, f32 states)
    // The GPU runs the main layers and the first draft layer (GpuDeepseekV4::KvLayoutFor).
    KvLayout layout = model.KvLayoutFor(o.block_size);
    layout.resize(std::min(layout.size(),
                           static_cast<size_t>(c.num_layers + (model.has_draft_layer() ? 1 : 0))));
    return KvStorage::GroupBytesPerBlock(layout, static_cast<int64_t>(groups.size()));
  }
  const int64_t elem = o.kv_cache_dtype == KvCacheDType::kFp8 ? 1
                       : o.cuda_dtype == DType::kBF16         ? 2
                                                              : 4;
  return {2 * c.num_layers * o.block_size * c.num_kv_heads * c.head_dim * elem};
}

ModelRunner::ModelRunner(Model& model, const RunnerOptions& options)
    : model_(model),
      f32_activations_(options.f32_activations),
      device_(options.device),
      block_size_(options.block_size),
      num_blocks_(options.group_num_blocks.empty() ? BlocksFor(options)
                                                   : options.group_num_blocks[0]),
      pool_(options.device == Device::kCpu
                ? (options.threads > 0 ? options.threads : DefaultThreadCount())
                : 1),
      groups_(model.KvGroupsFor(options.block_size)),
      kv_(options.device == Device::kCpu ? CpuKvLayout(model, options) : KvLayout{},
          GroupBlocks(options, groups_.size()), options.block_size) {
  if (device_ == Device::kCpu) {
    status_ = ApplyKvCacheDType(model.KvLayoutFor(block_size_), options.kv_cache_dtype,
                                model.config().arch)
                  .status();
    if (!status_.ok()) return;
  }
  if (device_ == Device::kCuda) {
    auto gpu = MakeGpuRunner(model, options);
    if (gpu.ok()) {
      gpu_ = std::move(*gpu);
    } else {
      status_ = gpu.status().WithContext("CUDA runner");
    }
  }
}

ModelRunner::~ModelRunner() = default;

StatusOr<TensorView> ModelRunner::Execute(std::span<const SeqChunk> chunks) {
  if (!status_.ok()) return status_;
#ifdef DINFER_WITH_CUDA
  if (gpu_ != nullptr) return gpu_->Execute(chunks);
#endif
  return Run(chunks, false);
}

bool ModelRunner::SupportsDeviceSampling() const {
  return status_.ok() && gpu_ != nullptr && model_.config().vocab_size <= kMaxDeviceSampleVocab;
}

StatusOr<DeviceSampleOutput> ModelRunner::ExecuteAndSample(
    std::span<const SeqChunk> chunks, const std::function<Status(DeviceSampleBatch&)>& prepare) {
  if (!status_.ok()) return status_;
#ifdef DINFER_WITH_CUDA
  if (gpu_ != nullptr) {
    DINFER_RETURN_IF_ERROR(gpu_->Launch(chunks));
    sample_batch_.Clear();
    DINFER_RETURN_IF_ERROR(prepare(sample_batch_));
    return gpu_->Sample(sample_batch_);
  }
#endif
  (void)chunks;
  (void)prepare;
  return Unimplemented("sampling on the device needs a CUDA runner");
}

StatusOr<TensorView> ModelRunner::ExecuteDraft(std::span<const SeqChunk> chunks) {
  if (!status_.ok()) return status_;
#ifdef DINFER_WITH_CUDA
  if (gpu_ != nullptr) return gpu_->ExecuteDraft(chunks);
#endif
  return Run(chunks, true);
}

StatusOr<TensorView> ModelRunner::Run(std::span<const SeqChunk> chunks, bool draft) {
  DINFER_ASSIGN_OR_RETURN(ForwardInput in, Prepare(chunks));
  const int64_t rows = static_cast<int64_t>(logits_rows_.size());
  const int64_t vocab = model_.config().vocab_size;
  if (logits_.empty() || logits_.view().rows() < rows) {
    logits_ = Tensor::Empty(DType::kF32, {std::max<int64_t>(rows, 1), vocab});
  }
  TensorView logits = TensorView::Make(logits_.view().data, DType::kF32, {rows, vocab});
  ops::OpContext ctx{&pool_, f32_activations_};
  if (draft) {
    DINFER_RETURN_IF_ERROR(model_.ForwardDraft(ctx, in, kv_, logits));
  } else {
    DINFER_RETURN_IF_ERROR(model_.Forward(ctx, in, kv_, logits));
  }
  return logits;
}

StatusOr<ForwardInput> ModelRunner::Prepare(std::span<const SeqChunk> chunks) {
  tokens_.clear();
  token_seq_.clear();
  positions_.clear();
  slots_.clear();
  logits_rows_.clear();
  block_tables_.clear();
  replay_end_.clear();
  bool replay = false;
  const int64_t bs = kv_.block_size();
  size_t max_blocks = 1;
  for (const auto& c : chunks) max_blocks = std::max(max_blocks, c.block_table.size());
  for (size_t s = 0; s < chunks.size(); ++s) {
    const SeqChunk& c = chunks[s];
    const int64_t end = c.start_pos + static_cast<int64_t>(c.tokens.size());
    if (static_cast<int64_t>(c.block_table.size()) * bs < end) {
      return InvalidArgument("sequence {} needs {} positions but its block table covers {}", s, end,
                             c.block_table.size() * bs);
    }
    for (int32_t b : c.block_table) {
      if (b < 0 || b >= kv_.num_blocks()) return InvalidArgument("block id {} out of range", b);
    }
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const int64_t pos = c.start_pos + static_cast<int64_t>(i);
      const bool replayed = pos < c.replay_end;  // rebuilds KV only: no logits
      if (!replayed && (c.logits == SeqChunk::Logits::kAll ||
                        (c.logits == SeqChunk::Logits::kLast && i + 1 == c.tokens.size()))) {
        logits_rows_.push_back(static_cast<int32_t>(tokens_.size()));
      }
      tokens_.push_back(c.tokens[i]);
      token_seq_.push_back(static_cast<int32_t>(s));
      positions_.push_back(static_cast<int32_t>(pos));
      slots_.push_back(static_cast<int64_t>(c.block_table[pos / bs]) * bs + pos % bs);
    }
    replay_end_.push_back(static_cast<int32_t>(std::max<int64_t>(c.replay_end, 0)));
    replay = replay || c.replay_end > c.start_pos;
    const size_t base = block_tables_.size();
    block_tables_.resize(base + max_blocks, 0);
    std::copy(c.block_table.begin(), c.block_table.end(), block_tables_.begin() + base);
  }
  // The other KV groups' tables, checked and padded the same way.
  const size_t num_groups = groups_.size();
  group_block_tables_.resize(num_groups);
  group_meta_.clear();
  if (num_groups > 1) {
    group_meta_.push_back({block_tables_, static_cast<int64_t>(max_blocks), bs});
  }
  for (size_t g = 1; g < num_groups; ++g) {
    auto table_of = [&](const SeqChunk& c) {
      return c.group_tables.empty() ? c.block_table : c.group_tables[g - 1];
    };
    size_t width = 1;
    for (const auto& c : chunks) {
      if (!c.group_tables.empty() && c.group_tables.size() + 1 != num_groups) {
        return InvalidArgument("a chunk has {} KV group tables; the model has {} groups",
                               c.group_tables.size() + 1, num_groups);
      }
      width = std::max(width, table_of(c).size());
    }
    std::vector<int32_t>& tables = group_block_tables_[g];
    tables.assign(chunks.size() * width, 0);
    for (size_t s = 0; s < chunks.size(); ++s) {
      const SeqChunk& c = chunks[s];
      const std::span<const int32_t> table = table_of(c);
      const int64_t end = c.start_pos + static_cast<int64_t>(c.tokens.size());
      if (static_cast<int64_t>(table.size()) < GroupBlocksFor(groups_[g], end)) {
        return InvalidArgument("sequence {} needs {} blocks of KV group '{}' but has {}", s,
                               GroupBlocksFor(groups_[g], end), groups_[g].name, table.size());
      }
      for (int32_t b : table) {
        if (b < 0 || b >= kv_.num_blocks(static_cast<int64_t>(g))) {
          return InvalidArgument("block id {} of KV group '{}' out of range", b, groups_[g].name);
        }
      }
      std::copy(table.begin(), table.end(), tables.begin() + static_cast<int64_t>(s * width));
    }
    group_meta_.push_back({tables, static_cast<int64_t>(width), groups_[g].block_size});
  }
  ForwardInput in;
  in.tokens = tokens_;
  in.logits_rows = logits_rows_;
  in.meta.token_seq = token_seq_;
  in.meta.positions = positions_;
  in.meta.slot_mapping = slots_;
  in.meta.block_tables = block_tables_;
  in.meta.max_blocks_per_seq = static_cast<int64_t>(max_blocks);
  in.meta.block_size = bs;
  in.meta.groups = group_meta_;
  if (replay) in.meta.replay_end = replay_end_;
  return in;
}

}  // namespace dinfer
