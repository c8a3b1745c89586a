#include "runner/model_runner.h"

#include <algorithm>

#ifdef DINFER_WITH_CUDA
#include "backend/cuda/device.h"
#include "model/layers/decoder.h"
#include "runner/cuda/gpu_runner.h"
#endif

namespace dinfer {

#ifndef DINFER_WITH_CUDA
class GpuRunner {};  // this build has no CUDA backend
#endif

namespace {

int64_t BlocksFor(const RunnerOptions& o) {
  if (o.num_blocks > 0) return o.num_blocks;
  return (o.max_seq_len + o.block_size - 1) / o.block_size;
}

StatusOr<std::unique_ptr<GpuRunner>> MakeGpuRunner(const Model& model, const RunnerOptions& o) {
#ifdef DINFER_WITH_CUDA
  if (cuda::DeviceCount() == 0) {
    return MakeError(StatusCode::kFailedPrecondition, "no CUDA device is visible");
  }
  const auto* decoder = dynamic_cast<const layers::DecoderModel*>(&model);
  if (decoder == nullptr) {
    return Unimplemented("architecture '{}' has no CUDA forward pass", model.config().arch);
  }
  DINFER_ASSIGN_OR_RETURN(auto gpu_model, GpuDecoder::Upload(*decoder, o.cuda_dtype));
  GpuRunnerOptions g;
  g.num_blocks = BlocksFor(o);
  g.block_size = o.block_size;
  g.max_seq_len = o.max_seq_len;
  g.max_num_tokens = o.max_num_tokens;
  g.max_num_seqs = o.max_num_seqs;
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

StatusOr<Device> ModelRunner::ParseDevice(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  if (name == "auto") return CudaAvailable() ? Device::kCuda : Device::kCpu;
  return InvalidArgument("device '{}': use cpu, cuda or auto", name);
}

int64_t ModelRunner::KvBytesPerBlock(const Model& model, const RunnerOptions& o) {
  if (o.device == Device::kCpu) return KvStorage::BytesPerBlock(model.KvLayoutFor(o.block_size));
  const ModelConfig& c = model.config();
  const int64_t elem = o.cuda_dtype == DType::kBF16 ? 2 : 4;
  return 2 * c.num_layers * o.block_size * c.num_kv_heads * c.head_dim * elem;
}

ModelRunner::ModelRunner(Model& model, const RunnerOptions& options)
    : model_(model),
      f32_activations_(options.f32_activations),
      device_(options.device),
      block_size_(options.block_size),
      num_blocks_(BlocksFor(options)),
      pool_(options.device == Device::kCpu
                ? (options.threads > 0 ? options.threads : DefaultThreadCount())
                : 1),
      kv_(options.device == Device::kCpu ? model.KvLayoutFor(options.block_size) : KvLayout{},
          num_blocks_, options.block_size) {
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
  if (device_ != Device::kCpu) return Unimplemented("draft layers run on the CPU only");
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
      if (c.logits == SeqChunk::Logits::kAll ||
          (c.logits == SeqChunk::Logits::kLast && i + 1 == c.tokens.size())) {
        logits_rows_.push_back(static_cast<int32_t>(tokens_.size()));
      }
      tokens_.push_back(c.tokens[i]);
      token_seq_.push_back(static_cast<int32_t>(s));
      positions_.push_back(static_cast<int32_t>(pos));
      slots_.push_back(static_cast<int64_t>(c.block_table[pos / bs]) * bs + pos % bs);
    }
    const size_t base = block_tables_.size();
    block_tables_.resize(base + max_blocks, 0);
    std::copy(c.block_table.begin(), c.block_table.end(), block_tables_.begin() + base);
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
  return in;
}

}  // namespace dinfer
