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

namespace dinfer {

struct SeqChunk {
  std::span<const int32_t> tokens;       // new tokens of this sequence in this step
  int64_t start_pos = 0;                 // position of tokens[0]
  std::span<const int32_t> block_table;  // blocks covering positions [0, start_pos + tokens.size())
  // Which logits to return: none, the last token's (to sample the next token), or every token's.
  enum class Logits { kNone, kLast, kAll } logits = Logits::kLast;
};

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
  // The model's draft (MTP) layer over the chunks of the previous Execute, each chunk's tokens
  // replaced by the tokens that follow them (see Model::ForwardDraft); same logits contract.
  StatusOr<TensorView> ExecuteDraft(std::span<const SeqChunk> chunks);

  const Model& model() const { return model_; }
  int64_t block_size() const { return kv_.block_size(); }
  int64_t num_blocks() const { return kv_.num_blocks(); }
  int threads() const { return pool_.num_threads(); }

 private:
  // Builds tokens, positions, slots, block tables and logits rows for the chunks.
  StatusOr<ForwardInput> Prepare(std::span<const SeqChunk> chunks);
  StatusOr<TensorView> Run(std::span<const SeqChunk> chunks, bool draft);

  Model& model_;
  bool f32_activations_;
  ThreadPool pool_;
  KvStorage kv_;
  std::vector<int32_t> tokens_, token_seq_, positions_, block_tables_, logits_rows_;
  std::vector<int64_t> slots_;
  Tensor logits_;
};

}  // namespace dinfer
