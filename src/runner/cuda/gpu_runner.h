// GpuRunner: executes steps (batches of SeqChunks) of a GpuModel on one CUDA device. It owns the
// paged KV cache in device memory, a stream, the per-step plan (built on the host in pinned
// memory, double-buffered, one copy to the device), CUDA graphs of decode steps per batch-size
// bucket (captured on first use, replayed after), the logits / greedy tokens copied back, and
// the buffers of sampling on the device (Sample).
// Launch returns without waiting, so the host prepares step N+1 while the device runs step N.
// Thread-safety: one thread at a time.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/memory.h"
#include "backend/cuda/stream.h"
#include "runner/cuda/gpu_model.h"
#include "runner/device_sampling.h"
#include "runner/seq_chunk.h"

namespace dinfer {

struct GpuRunnerOptions {
  int64_t num_blocks = 0;  // KV blocks that block tables index; 0: max_seq_len of one sequence
  // Blocks of each KV group of the model (GpuModel::KvGroupsFor); empty: num_blocks for each.
  std::vector<int64_t> group_num_blocks;
  int64_t block_size = 16;
  int64_t max_seq_len = 4096;     // block tables hold max_seq_len / block_size entries
  int64_t max_num_tokens = 8192;  // tokens per step
  int64_t max_num_seqs = 256;     // sequences per step; decode graphs cover batches up to this
  int64_t max_logits_rows = 0;    // logits rows per step; 0: max_num_seqs
  bool cuda_graphs = true;
  // kF8E4M3: the KV cache holds float8 e4m3fn (half the bytes of bf16), k / kv_scale and
  // v / kv_scale with one fixed scale for every layer (1.0, vLLM's default without calibrated
  // scales, suits K and V of at most 448 in magnitude); bf16 models with head_dim 64 or 128.
  // Any other value: the model's dtype.
  DType kv_cache_dtype = DType::kBF16;
  float kv_scale = 1.0f;
};

struct LaunchOptions {
  bool greedy = false;  // also pick each logits row's argmax on the device
  // Every chunk has one token, and chunk i's token is row i of the previous step's greedy tokens,
  // still on the device (the chunk's own token is not read): decode without a host round trip.
  bool tokens_from_last_step = false;
  // The model's draft layer (GpuModel::ForwardDraft) over the chunks of the last step, their
  // tokens shifted by one; never a graph.
  bool draft = false;
};

class GpuRunner {
 public:
  static StatusOr<std::unique_ptr<GpuRunner>> Create(std::unique_ptr<GpuModel> model,
                                                     const GpuRunnerOptions& options);

  // Plans the step, copies the plan to the device and enqueues the forward pass; does not wait.
  Status Launch(std::span<const SeqChunk> chunks, const LaunchOptions& options = {});
  // Wait for the last launched step. Logits [rows, vocab] f32 in host memory, rows in chunk
  // order; valid until the next Launch.
  StatusOr<TensorView> Logits();
  StatusOr<std::span<const int32_t>> GreedyTokens();  // after a greedy Launch
  // Launch and Logits.
  StatusOr<TensorView> Execute(std::span<const SeqChunk> chunks);
  // Launch with LaunchOptions::draft, and Logits.
  StatusOr<TensorView> ExecuteDraft(std::span<const SeqChunk> chunks);
  // Samples one token per logits row of the last Launch on the device (batch.rows: one per row)
  // and waits for the tokens; the logits are changed in place (masks, penalties), so Logits()
  // no longer gives the model's. Valid until the next Launch.
  StatusOr<DeviceSampleOutput> Sample(const DeviceSampleBatch& batch);

  const GpuModel& model() const { return *model_; }
  const cuda::Stream& stream() const { return stream_; }
  int64_t num_blocks() const { return options_.num_blocks; }
  int64_t block_size() const { return options_.block_size; }
  size_t graphs_captured() const { return graphs_.size(); }

 private:
  // Byte offsets of the plan's arrays in the staging buffer and its device copy.
  struct Layout {
    size_t tokens, positions, token_seq, slots, seq_end, tables, logits_rows, row_tokens, tile_seq,
        tile_token, replay_end, total;
    size_t group_tables[kMaxGpuKvGroups];
  };
  GpuRunner() = default;
  Layout LayoutFor(int64_t tokens, int64_t seqs, int64_t rows, int64_t tiles, int64_t logits,
                   int64_t width) const;
  // Fills the staging buffer with block tables of `width` entries; pad_to > chunks pads with
  // one-token sequences on the sink block.
  StatusOr<GpuStep> Plan(std::span<const SeqChunk> chunks, int64_t pad_to, int64_t width,
                         bool use_tiles, size_t* bytes);
  int64_t Bucket(int64_t n) const;

  // Entries of group g's tables for group 0 tables of `width` entries.
  int64_t GroupWidth(size_t g, int64_t width) const;

  std::unique_ptr<GpuModel> model_;
  GpuRunnerOptions options_;
  cuda::DeviceInfo device_;
  cuda::Stream stream_;
  int64_t width_ = 0;  // block table entries per sequence at most
  std::vector<KvGroup> groups_;
  // The caller's blocks of each group; the next block id is the group's sink, which padded
  // sequences write to.
  std::vector<int64_t> group_blocks_;
  cuda::DeviceBuffer kv_memory_;
  GpuKvCache kv_;
  cuda::PinnedBuffer stage_[2];
  cuda::Event stage_free_[2];
  int stage_index_ = 0;
  cuda::DeviceBuffer plan_;
  cuda::DeviceBuffer logits_, greedy_;
  cuda::PinnedBuffer logits_host_, greedy_host_;
  cuda::Event done_;
  std::map<std::pair<int64_t, int64_t>, cuda::Graph> graphs_;  // by (batch, table width)
  int64_t last_rows_ = 0;
  int64_t last_tokens_ = 0;  // tokens of the last forward step (padding included)
  bool last_greedy_ = false;
  std::vector<int32_t> tile_order_;
  // Sampling: inputs staged in pinned memory and copied in one go (grown on demand), scratch,
  // and outputs copied back.
  cuda::PinnedBuffer sample_stage_;
  cuda::DeviceBuffer sample_in_, sample_scratch_, sample_out_;
  cuda::PinnedBuffer sample_out_host_;
};

}  // namespace dinfer
