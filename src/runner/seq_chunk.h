// SeqChunk: what one step computes for one sequence (its new tokens, where they start, its block
// table, which logits to return). The unit of work that every runner (CPU or CUDA) executes.
// A plain value of views; the memory it points to must outlive the step.
#pragma once

#include <cstdint>
#include <span>

namespace dinfer {

struct SeqChunk {
  std::span<const int32_t> tokens;       // new tokens of this sequence in this step
  int64_t start_pos = 0;                 // position of tokens[0]
  std::span<const int32_t> block_table;  // blocks covering positions [0, start_pos + tokens.size())
  // Which logits to return: none, the last token's (to sample the next token), or every token's.
  enum class Logits { kNone, kLast, kAll } logits = Logits::kLast;
  // Models with several KV groups: the block tables of groups 1, 2, ... (group 0's is
  // block_table). Empty: block_table serves every group (block ids of each group's own pool).
  std::span<const std::span<const int32_t>> group_tables = {};
  // Bounded replay: positions below replay_end rebuild sliding-window KV only (no logits; the
  // rows they would write in other KV groups belong to shared cached blocks and are left alone).
  // Only for models that declare a replay bound (Model::WindowReplayTokens). 0: none.
  int64_t replay_end = 0;
};

}  // namespace dinfer
