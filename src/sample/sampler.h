// Token sampling from a logits row. A Sampler owns one request's sampling state: its parameters,
// the tokens seen so far (prompt and generated, as sparse counts for the penalties) and a random
// stream that depends only on the seed and the number of draws so far, so a seeded request gives
// the same tokens wherever and whenever it runs, alone or in any batch. Per draw it applies, in
// order: logit bias, min_tokens masking of stop tokens, repetition / presence / frequency
// penalties, then greedy or temperature + top-k + min-p + top-p sampling. A Sampler is owned by
// one request; not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dinfer::sample {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: off
  double top_p = 1.0;        // 1: off
  double min_p = 0.0;        // 0: off
  uint64_t seed = 0;
  // HF semantics, over prompt and generated tokens: a seen token's logit l becomes l / p when
  // l > 0, else l * p. 1: off.
  double repetition_penalty = 1.0;
  // OpenAI semantics, over generated tokens only: l -= presence * (count > 0) + frequency * count.
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  // (token id, bias) added to the logits before anything else; duplicates add up. Ids outside
  // the vocabulary are skipped here (ValidateSamplingParams rejects them).
  std::vector<std::pair<int32_t, float>> logit_bias = {};
  // While fewer than min_tokens tokens have been accepted, stop_token_ids get -inf. The caller
  // lists every token that would end the request here, EOS included unless it is ignored.
  int32_t min_tokens = 0;
  std::vector<int32_t> stop_token_ids = {};
  // -1: no logprobs; 0: the chosen token's only; n: also the n most likely tokens.
  int logprobs = -1;
};

inline constexpr int kMaxLogprobs = 20;

// InvalidArgument naming the first bad field, or OK.
Status ValidateSamplingParams(const SamplingParams& params, int64_t vocab_size);

// Counter-based generator (SplitMix64 over (seed, step)): the draw for step i is a pure function
// of (seed, i).
double UniformDraw(uint64_t seed, uint64_t step);

// Logprobs describe the logits as given to the sampler (the model's distribution, after any
// grammar mask the caller applied), before bias, penalties, temperature and truncation: they say
// how likely the model found a token, not how it was picked. A masked (-inf) token reports -inf.
struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;  // of token; 0 when params.logprobs < 0
  // The params.logprobs most likely tokens (at most the vocabulary), by logprob descending, ties
  // by token id ascending; the chosen token appears here only if it is among them.
  std::vector<std::pair<int32_t, float>> top;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Records the prompt for the repetition penalty; replaces a prompt set earlier.
  void SetPrompt(std::span<const int32_t> prompt);
  // Records a generated token once it is final. Sample() does not accept on its own, so a draw
  // that is thrown away (a rejected draft, an aborted step) leaves no trace in the penalties.
  void Accept(int32_t token);

  // Picks the next token from logits (one row of vocab_size floats). Each call is one draw: the
  // n-th call uses random step n, whatever was accepted in between.
  int32_t Sample(std::span<const float> logits);
  // Sample() plus the logprobs that params.logprobs asks for.
  SampleResult SampleWithLogprobs(std::span<const float> logits);

  // Applies logit bias, min_tokens masking and the penalties in place, as Sample() does before
  // it draws.
  void ProcessLogits(std::span<float> logits) const;

  const SamplingParams& params() const { return params_; }
  uint64_t steps() const { return steps_; }                 // draws so far
  int64_t num_generated() const { return num_generated_; }  // tokens accepted so far

  // For a draw made elsewhere (on a GPU) from this sampler's state: returns the random step it
  // uses and counts it, as Sample() would.
  uint64_t AdvanceStep() { return steps_++; }
  // The state ProcessLogits reads besides the parameters: the tokens the penalties apply to.
  struct Seen {
    int32_t count = 0;  // times generated
    bool in_prompt = false;
  };
  const std::unordered_map<int32_t, Seen>& seen() const { return seen_; }
  // Whether ProcessLogits bans the stop tokens (min_tokens not reached yet).
  bool BansStopTokens() const { return num_generated_ < params_.min_tokens; }

 private:
  bool NeedsProcessing() const;
  int32_t Draw(std::span<const float> logits);
  int32_t DrawFromDistribution(std::span<const float> logits, uint64_t step);
  int32_t DrawSorted(float max_logit, double z, double u);
  void FillLogprobs(std::span<const float> logits, SampleResult& result);

  SamplingParams params_;
  bool track_prompt_;  // repetition penalty on
  bool track_counts_;  // any penalty on
  uint64_t steps_ = 0;
  int64_t num_generated_ = 0;
  // Sparse history: cost per step follows the distinct tokens seen, not the vocabulary.
  std::unordered_map<int32_t, Seen> seen_;
  // Buffers reused across calls, so steady-state draws allocate nothing vocabulary-sized.
  std::vector<float> work_;
  std::vector<std::pair<float, int32_t>> candidates_;  // (logit, token)
  std::vector<double> probs_;
  std::vector<std::pair<float, int32_t>> top_;
};

// Index of the largest logit; the lowest index wins ties.
int32_t Argmax(std::span<const float> logits);

}  // namespace dinfer::sample
