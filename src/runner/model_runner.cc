#include "runner/model_runner.h"

#include <algorithm>

namespace dinfer {
namespace {

int64_t BlocksFor(const RunnerOptions& o) {
  if (o.num_blocks > 0) return o.num_blocks;
  return (o.max_seq_len + o.block_size - 1) / o.block_size;
}

}  // namespace

ModelRunner::ModelRunner(Model& model, const RunnerOptions& options)
    : model_(model),
      f32_activations_(options.f32_activations),
      pool_(options.threads > 0 ? options.threads : DefaultThreadCount()),
      kv_(model.KvLayoutFor(options.block_size), BlocksFor(options), options.block_size) {}

StatusOr<TensorView> ModelRunner::Execute(std::span<const SeqChunk> chunks) {
  return Run(chunks, false);
}

StatusOr<TensorView> ModelRunner::ExecuteDraft(std::span<const SeqChunk> chunks) {
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
