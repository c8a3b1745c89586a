// ModelRunner: owns the paged KV memory and the thread pool of one model and executes a batch of
// sequence chunks: builds the attention metadata (slots, block tables, positions) once per step
// and runs the forward pass, on the CPU or through GpuRunner on a CUDA device. Block allocation
// is the caller's (the KV manager's) business.
// One Execute at a time; not thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "model/model.h"
#include "runner/device_sampling.h"
#include "runner/seq_chunk.h"

namespace dinfer {

struct RunnerOptions {
  int64_t num_blocks = 0;  // 0: enough for max_seq_len of one sequence
  // Blocks of each KV group (the model's KvGroupsFor); empty: num_blocks for every group.
  std::vector<int64_t> group_num_blocks;
  int64_t block_size = 16;
  int64_t max_seq_len = 4096;
  int threads = 0;  // 0: all available cores
  // Quantized weights: f32 activations (reference numerics, slower) instead of 8-bit ones.
  bool f32_activations = false;
  // How the KV cache is stored. CPU: auto (as the model chooses), f32 or bf16. CUDA: auto or bf16
  // (K and V in cuda_dtype), or fp8 (e4m3 with one fixed scale, kv_scale: GpuRunnerOptions).
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
  // kCuda: the forward pass runs on the current CUDA device with the weights copied there as
  // bf16 (a build with -DDINFER_CUDA=ON, an architecture built on layers::DecoderModel), within
  // these limits per step.
  Device device = Device::kCpu;
  DType cuda_dtype = DType::kBF16;  // f32 keeps CUDA numerics next to the CPU's (tests)
  float kv_scale = 1.0f;            // CUDA, kv_cache_dtype fp8
  // CUDA: the layers' matrices as e4m3 with per-channel scales (GpuDecoder::QuantizeWeightsFp8).
  bool cuda_fp8_weights = false;
  int64_t max_num_tokens = 8192;
  int64_t max_num_seqs = 256;
};

class GpuRunner;

class ModelRunner {
 public:
  // A CUDA runner that cannot be set up reports why through status() and every Execute.
  ModelRunner(Model& model, const RunnerOptions& options);
  ~ModelRunner();

  // Returns logits [rows, vocab], rows in chunk order, in host memory; valid until the next
  // Execute.
  StatusOr<TensorView> Execute(std::span<const SeqChunk> chunks);
  // The model's draft (MTP) layer over the chunks of the previous Execute, each chunk's tokens
  // replaced by the tokens that follow them (see Model::ForwardDraft); same logits contract.
  StatusOr<TensorView> ExecuteDraft(std::span<const SeqChunk> chunks);

  // Whether ExecuteAndSample works here: a CUDA runner that is set up, a vocabulary of at most
  // kMaxDeviceSampleVocab tokens.
  bool SupportsDeviceSampling() const;
  // Execute with sampling on the device: launches the forward pass, calls `prepare` while it
  // computes to fill the batch (one row per logits row; the batch starts empty), samples on the
  // device and returns the tokens, without copying logits to the host. Valid until the next
  // Execute.
  StatusOr<DeviceSampleOutput> ExecuteAndSample(
      std::span<const SeqChunk> chunks, const std::function<Status(DeviceSampleBatch&)>& prepare);

  const Status& status() const { return status_; }
  Device device() const { return device_; }
  const Model& model() const { return model_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  // The model's KV groups and the blocks of each (group 0's are num_blocks()).
  const std::vector<KvGroup>& kv_groups() const { return groups_; }
  int64_t group_num_blocks(int64_t group) const { return kv_.num_blocks(group); }
  int threads() const { return pool_.num_threads(); }

  // Whether this build has the CUDA backend and a CUDA device is visible.
  static bool CudaAvailable();
  // "cpu", "cuda", or "auto" (CUDA when available, else the CPU).
  static StatusOr<Device> ParseDevice(std::string_view name);
  // "none", or "fp8" (cuda_fp8_weights; the CUDA runner only).
  static Status CheckQuantization(std::string_view name, Device device);
  // Bytes of KV cache per block of each KV group with these options (the model's KV layout in f32
  // on the CPU, K and V in cuda_dtype on CUDA).
  static std::vector<int64_t> KvBytesPerBlock(const Model& model, const RunnerOptions& options);

 private:
  // Builds tokens, positions, slots, block tables and logits rows for the chunks.
  StatusOr<ForwardInput> Prepare(std::span<const SeqChunk> chunks);
  StatusOr<TensorView> Run(std::span<const SeqChunk> chunks, bool draft);

  Model& model_;
  bool f32_activations_;
  Device device_;
  int64_t block_size_, num_blocks_;
  ThreadPool pool_;
  std::vector<KvGroup> groups_;
  KvStorage kv_;  // CPU only (no layers on CUDA)
  std::unique_ptr<GpuRunner> gpu_;
  Status status_;
  DeviceSampleBatch sample_batch_;
  std::vector<int32_t> tokens_, token_seq_, positions_, block_tables_, logits_rows_, replay_end_;
  std::vector<std::vector<int32_t>> group_block_tables_;  // groups 1, 2, ...
  std::vector<ops::GroupBlockTables> group_meta_;
  std::vector<int64_t> slots_;
  Tensor logits_;
};

}  // namespace dinfer
