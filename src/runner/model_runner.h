// ModelRunner: owns the paged KV memory and the thread pool of one model and executes a batch of
// sequence chunks: builds the attention metadata (slots, block tables, positions) once per step
// and runs the forward pass. Block allocation is the caller's (the KV manager's) business.
// One Execute at a time; not thread-safe.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "model/model.h"
#include "runner/seq_chunk.h"

namespace dinfer {

struct RunnerOptions {
  int64_t num_blocks = 0;  // 0: enough for max_seq_len of one sequence
  int64_t block_size = 16;
  int64_t max_seq_len = 4096;
  int threads = 0;  // 0: all available cores
  // Quantized weights: f32 activations (reference numerics, slower) instead of 8-bit ones.
  bool f32_activations = false;
};

class ModelRunner {
 public:
  ModelRunner(Model& model, const RunnerOptions& options);

  // Returns logits [rows, vocab], rows in chunk order; valid until the next Execute.
  StatusOr<TensorView> Execute(std::span<const SeqChunk> chunks);

  const Model& model() const { return model_; }
  int64_t block_size() const { return kv_.block_size(); }
  int64_t num_blocks() const { return kv_.num_blocks(); }
  int threads() const { return pool_.num_threads(); }

 private:
  Model& model_;
  bool f32_activations_;
  ThreadPool pool_;
  KvStorage kv_;
  std::vector<int32_t> tokens_, token_seq_, positions_, block_tables_, logits_rows_;
  std::vector<int64_t> slots_;
  Tensor logits_;
};

}  // namespace dinfer
