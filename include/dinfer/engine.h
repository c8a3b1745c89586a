// dinfer's public C++ API: an Engine serves one model; Submit() queues a request and returns a
// stream of its outputs (token deltas and text), Abort() cancels one, Stats() reports load.
// The Engine runs its step loop on its own thread: every method is thread-safe, and a
// RequestStream may be read from any one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dinfer/prompt.h"
#include "dinfer/status.h"

namespace dinfer {

struct EngineOptions {
  std::string model = "default";          // "default", an HF model directory or a .gguf file
  int threads = 0;                        // CPU threads (0: all cores)
  int64_t kv_cache_mib = 512;             // memory for the KV cache
  int64_t block_size = 16;                // tokens per KV block
  int64_t max_num_seqs = 64;              // requests running at once
  int64_t max_num_batched_tokens = 2048;  // tokens per step (at most 32,768)
  int64_t max_model_len = 0;  // prompt + output tokens per request (0: the model's context)
  bool enable_prefix_caching = true;
  // SWA bounded replay (DeepSeek-V4): a prefix hit whose sliding-window KV is gone recomputes
  // this many tokens before the hit to rebuild the window. 0: the model's exact bound (the
  // window's receptive field through every layer, 5,588 tokens for V4-Flash), so results equal a
  // full recompute; N > 0: N tokens (DeepInfer replays the last window plus some backtracking
  // tokens, 140): less to recompute, but below the exact bound the rebuilt window keys of the
  // deeper layers only approximate those of a full recompute.
  int64_t swa_replay_tokens = 0;
  // Time budget per step (0: off): prompt chunks are cut so that a step's time, predicted by a
  // cost model fitted to this model at start-up, stays within it; decodes always run.
  double step_time_budget_ms = 0.0;
  std::string cost_profile;      // where to load/save that cost model (optional)
  bool f32_activations = false;  // quantized models: reference numerics instead of 8-bit
  bool show_progress = true;     // loading progress on stderr
  // Where the model runs: "cuda" (the first GPU, weights as bf16), "cpu", or "auto": the GPU when
  // this build has CUDA and one is visible, else the CPU.
  std::string device = "auto";
  // KV cache storage: "auto" (CPU: the model's choice, bf16 keys and compressed entries for
  // DeepSeek-V4, f32 for the others; CUDA: bf16), "f32" (CPU), "bf16" (CUDA, or CPU models that
  // store some KV as bf16), or "fp8" (CUDA: float8 e4m3fn, half the bytes of bf16, so twice the
  // tokens fit, storing K / kv_cache_scale and V / kv_cache_scale; DeepSeek-V4 on the CPU: its
  // bf16 planes as e4m3 with a power-of-two scale per 32 values).
  std::string kv_cache_dtype = "auto";
  double kv_cache_scale = 1.0;
  // "none", or "fp8": on CUDA, the layers' matrices as e4m3 with one scale per output channel,
  // multiplied by FP8 GEMMs with activations quantized per token (the embedding and LM head stay
  // bf16).
  std::string quantization = "none";
  // Speculative decoding: tokens the model's draft (MTP) layer proposes per decode step, verified
  // by the next step (0: off; 1: DeepSeek-V4's MTP layer). Models without a draft layer refuse
  // it. Requests without a grammar or logprobs speculate (greedy or sampled, with penalties: on
  // the CPU outputs are token for token those without speculation; on the GPU, whose products are
  // not batch-invariant, up to bf16 rounding), the others decode as usual; the engine steps
  // synchronously and samples on the host while it is on.
  int num_speculative_tokens = 0;
  // Drafts scheduled by confidence. A draft costs the next step one more token (compute and KV)
  // and gains one when accepted, so it is proposed only when the draft layer's probability of its
  // token (its confidence, an estimate of the chance of acceptance) is at least
  // speculative_min_confidence (0..1; 0: every draft, 1: only certain ones). With
  // speculative_min_acceptance > 0 (0..1), a request whose recent acceptance rate (a moving
  // average over its verified drafts, weight 1/4 on the newest) falls below it stops drafting,
  // except for one probe every 8 steps, and resumes as soon as a probe is accepted.
  double speculative_min_confidence = 0.0;
  double speculative_min_acceptance = 0.0;
};

// Structured output: the generated text must follow a JSON Schema ("json_schema"), be any JSON
// object ("json_object"), match a regular expression ("regex"), an EBNF grammar in GBNF or W3C
// notation ("grammar") or be one of several strings ("choice"). Grammars compile on worker
// threads and are cached per grammar; one that cannot be enforced makes Submit fail with a message
// naming the feature. Generation stops once the text is complete and nothing else may follow.
struct StructuredOutput {
  std::string type;                  // "" for none
  std::string value;                 // the schema, regular expression or grammar
  std::vector<std::string> choices;  // "choice"
  // JSON: whitespace bytes allowed at each place JSON allows them (0: compact; -1: unbounded).
  int max_whitespace = 16;
};

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;
  int top_k = 0;  // 0: off
  double min_p = 0.0;
  std::optional<uint64_t> seed;  // with a seed, output depends only on prompt, params and seed
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // in addition to the model's end-of-sequence tokens
  bool ignore_eos = false;
  bool skip_special_tokens = true;  // in the text
  double repetition_penalty = 1.0;  // over prompt and output tokens (HF semantics)
  double presence_penalty = 0.0;    // over output tokens (OpenAI semantics), [-2, 2]
  double frequency_penalty = 0.0;   // over output tokens (OpenAI semantics), [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits, [-100, 100]
  int32_t min_tokens = 0;  // stop tokens are held back until this many were generated
  int logprobs = -1;       // -1: none; n >= 0: the chosen token's and the top n (n <= 20)
  int n = 1;               // completions of the prompt (they share its KV blocks)
  StructuredOutput structured;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;                        // log-softmax of the model's logits
  std::vector<std::pair<int32_t, float>> top;  // most likely tokens, descending
};

struct RequestSpec {
  std::string prompt;               // text (special-token markup recognised), or
  std::vector<int32_t> prompt_ids;  // token ids, used as given
  SamplingParams sampling;
  int priority = 0;        // lower runs first
  std::string cache_salt;  // requests with different salts never share cached KV
};

struct RequestOutput {
  int64_t request_id = 0;
  int index = 0;                       // which of the n completions
  std::vector<int32_t> token_ids;      // new tokens since the previous output
  std::vector<TokenLogprob> logprobs;  // one per token when SamplingParams::logprobs >= 0
  std::string text;                    // their text (complete UTF-8 only)
  bool finished = false;
  std::string finish_reason;  // "stop", "length", "abort", "error"
  std::string error;          // when finish_reason == "error"
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;
};

// What a server needs to know about the loaded model.
struct ModelInfo {
  std::string path;                  // resolved checkpoint file or directory
  std::string architecture;          // registry key ("llama", "qwen2", ...)
  std::string chat_template;         // Jinja source from the checkpoint (empty: none)
  std::string bos_token, eos_token;  // their text, as templates refer to them
  bool add_bos_token = false;        // whether a text prompt starts with the BOS token
  int64_t max_model_len = 0;         // prompt + output tokens per request
  int64_t vocab_size = 0;
  // The checkpoint's sampling defaults (generation_config.json).
  double temperature = 1.0, top_p = 1.0;
  int top_k = 0;
  // The checkpoint's template for requests with tools, when it names one "tool_use" (transformers
  // then renders with it; empty: use chat_template).
  std::string tool_use_chat_template;
};

class RequestStream {
 public:
  virtual ~RequestStream() = default;
  virtual int64_t id() const = 0;
  // Blocks until the next output; nullopt once every completion's finished output was returned.
  virtual std::optional<RequestOutput> Next() = 0;
  // The next output if one is queued, else nullopt (never blocks).
  virtual std::optional<RequestOutput> TryNext() = 0;
  // Event-driven readers (the HTTP server) need no thread per stream: `ready` runs after every
  // output is queued, on the engine's thread, and at once here if outputs are already waiting.
  // It must return quickly and must not call Next().
  virtual void SetReadyCallback(std::function<void()> ready) = 0;
};

struct EngineStatsSnapshot {
  int64_t running = 0, waiting = 0, steps = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, preemptions = 0;
  double kv_usage = 0.0;                        // fraction of KV blocks in use
  int64_t prefix_queries = 0, prefix_hits = 0;  // prompt tokens looked up / found cached
  // Of the hits, tokens recomputed to rebuild sliding-window KV dropped from the cache (SWA
  // bounded replay: a hit of T tokens computes from T minus the model's window receptive field).
  int64_t prefix_replay_tokens = 0;
  // Speculative decoding: draft tokens verified and accepted (acceptance rate = accepted / draft),
  // and drafts not proposed: below speculative_min_confidence, or of a request whose acceptance
  // fell below speculative_min_acceptance.
  int64_t draft_tokens = 0, accepted_draft_tokens = 0;
  int64_t low_confidence_drafts = 0, paused_drafts = 0;
};

class Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  virtual ~Engine() = default;

  virtual StatusOr<std::shared_ptr<RequestStream>> Submit(const RequestSpec& request) = 0;
  virtual void Abort(int64_t request_id) = 0;
  virtual EngineStatsSnapshot Stats() const = 0;

  // Tokenizer access for callers that render prompts themselves.
  virtual StatusOr<std::vector<int32_t>> Encode(const std::string& text) const = 0;
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;
  // A rendered chat prompt (see PromptSegment); no BOS is added: templates write their own.
  virtual StatusOr<std::vector<int32_t>> EncodeSegments(
      const std::vector<PromptSegment>& segments) const = 0;
  virtual ModelInfo model_info() const = 0;
  virtual int64_t vocab_size() const = 0;
};

}  // namespace dinfer
