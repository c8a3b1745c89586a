#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace dinfer {

StatusOr<GenerateResult> Generate(ModelRunner& runner, std::span<const int32_t> prompt,
                                  const GenerateOptions& options,
                                  const std::function<bool(int32_t)>& on_token) {
  if (prompt.empty()) return InvalidArgument("the prompt is empty");
  const int64_t capacity = runner.num_blocks() * runner.block_size();
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_tokens;
  if (total > capacity) {
    return InvalidArgument("prompt ({} tokens) + max tokens ({}) exceed the KV cache ({} tokens)",
                           prompt.size(), options.max_tokens, capacity);
  }
  const int64_t max_pos = runner.model().config().max_position_embeddings;
  if (total > max_pos) {
    return InvalidArgument("prompt ({} tokens) + max tokens ({}) exceed the model's context of {}",
                           prompt.size(), options.max_tokens, max_pos);
  }
  std::vector<int32_t> table(static_cast<size_t>(runner.num_blocks()));
  std::iota(table.begin(), table.end(), 0);
  sample::Sampler sampler(options.sampling);
  GenerateResult result;
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  TensorView logits;
  const int64_t chunk = std::max<int64_t>(1, options.prefill_chunk);
  for (int64_t pos = 0; pos < static_cast<int64_t>(prompt.size()); pos += chunk) {
    const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(prompt.size()) - pos);
    SeqChunk c{prompt.subspan(pos, n), pos, table, SeqChunk::Logits::kLast};
    DINFER_ASSIGN_OR_RETURN(logits, runner.Execute(std::span(&c, 1)));
  }
  auto t1 = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  int64_t pos = static_cast<int64_t>(prompt.size());
  const int64_t vocab = runner.model().config().vocab_size;
  while (static_cast<int64_t>(result.tokens.size()) < options.max_tokens) {
    const int32_t token =
        sampler.Sample(std::span<const float>(logits.as<float>(), static_cast<size_t>(vocab)));
    result.tokens.push_back(token);
    if (on_token && !on_token(token)) {
      result.finish = FinishReason::kCallback;
      break;
    }
    const bool is_stop = std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(),
                                   token) != options.stop_token_ids.end();
    if (is_stop && !options.ignore_eos) {
      result.finish = FinishReason::kStop;
      break;
    }
    if (static_cast<int64_t>(result.tokens.size()) == options.max_tokens) break;
    SeqChunk c{std::span<const int32_t>(&result.tokens.back(), 1), pos, table,
               SeqChunk::Logits::kLast};
    DINFER_ASSIGN_OR_RETURN(logits, runner.Execute(std::span(&c, 1)));
    ++pos;
  }
  result.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return result;
}

}  // namespace dinfer
