// Single-request generation on a ModelRunner: chunked prefill of the prompt, then token-by-token
// decoding with a seeded sampler, streaming each token to a callback. It owns the runner's whole
// KV cache for the request's lifetime (the batched engine shares it between requests).
#pragma once

#include <functional>
#include <vector>

#include "base/status.h"
#include "runner/model_runner.h"
#include "sample/sampler.h"

namespace dinfer {

struct GenerateOptions {
  int64_t max_tokens = 128;
  sample::SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // generation ends after emitting one of these
  bool ignore_eos = false;
  int64_t prefill_chunk = 512;
};

enum class FinishReason { kLength, kStop, kCallback };

struct GenerateResult {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kLength;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// on_token returns false to stop early.
StatusOr<GenerateResult> Generate(ModelRunner& runner, std::span<const int32_t> prompt,
                                  const GenerateOptions& options,
                                  const std::function<bool(int32_t)>& on_token = nullptr);

}  // namespace dinfer
