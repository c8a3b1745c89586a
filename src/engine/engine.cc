// The threaded Engine behind include/dinfer/engine.h: an inbox of submissions and aborts, a loop
// thread that drives EngineCore, and per-request streams with incremental detokenization.
#include "dinfer/engine.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <xxhash.h>

#include "base/logging.h"
#include "base/thread_pool.h"
#include "engine/engine_core.h"
#include "model/loader.h"
#include "structured/grammar_cache.h"

namespace dinfer {
namespace {

// The outputs of one submitted request: its n completions (core requests id .. id + n - 1),
// each with its own detokenizer. Finished once every completion finished.
class Stream final : public RequestStream {
 public:
  Stream(int64_t id, int n, const tokenizer::Tokenizer* tok, bool skip_special)
      : id_(id), unreturned_finishes_(n) {
    for (int i = 0; tok != nullptr && i < n; ++i) {
      detoks_.push_back(std::make_unique<tokenizer::IncrementalDetokenizer>(*tok, skip_special));
    }
  }
  int64_t id() const override { return id_; }

  std::optional<RequestOutput> Next() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty() || returned_all_; });
    return PopLocked();
  }

  std::optional<RequestOutput> TryNext() override {
    std::lock_guard<std::mutex> lock(mu_);
    return PopLocked();
  }

  void SetReadyCallback(std::function<void()> ready) override {
    bool waiting = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_ = ready;
      waiting = !queue_.empty();
    }
    if (waiting && ready) ready();
  }

  // Called by the engine thread with the delta of completion `index`.
  void Push(int index, const TokenDelta& d) {
    RequestOutput out;
    out.request_id = id_;
    out.index = index;
    out.token_ids = d.tokens;
    for (const auto& lp : d.logprobs) out.logprobs.push_back({lp.token, lp.logprob, lp.top});
    if (!detoks_.empty()) {
      auto& detok = *detoks_[static_cast<size_t>(index)];
      for (int32_t t : d.tokens) out.text += detok.Push(t);
      if (d.finish != FinishReason::kNone) out.text += detok.Flush();
    }
    out.finished = d.finish != FinishReason::kNone;
    out.finish_reason = std::string(FinishReasonName(d.finish));
    out.error = d.error;
    out.prompt_tokens = d.num_prompt_tokens;
    out.cached_prompt_tokens = d.num_cached_tokens;
    std::function<void()> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(out));
      ready = ready_;
    }
    cv_.notify_all();
    if (ready) ready();
  }

 private:
  std::optional<RequestOutput> PopLocked() {
    if (queue_.empty()) return std::nullopt;
    RequestOutput out = std::move(queue_.front());
    queue_.pop_front();
    if (out.finished && --unreturned_finishes_ == 0) returned_all_ = true;
    return out;
  }

  const int64_t id_;
  std::vector<std::unique_ptr<tokenizer::IncrementalDetokenizer>> detoks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  std::function<void()> ready_;
  int unreturned_finishes_;
  bool returned_all_ = false;
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(LoadedModel lm, const EngineOptions& o, Device device, KvCacheDType kv_cache_dtype)
      : lm_(std::move(lm)) {
    EngineConfig c;
    c.device = device;
    c.kv_cache_dtype = kv_cache_dtype;
    c.kv_scale = static_cast<float>(o.kv_cache_scale);
    c.cuda_fp8_weights = o.quantization == "fp8";
    c.threads = o.threads;
    c.block_size = o.block_size;
    c.kv_cache_bytes = o.kv_cache_mib << 20;
    c.enable_prefix_caching = o.enable_prefix_caching;
    c.swa_replay_tokens = o.swa_replay_tokens;
    c.f32_activations = o.f32_activations;
    c.scheduler.step_time_budget_s = o.step_time_budget_ms / 1e3;
    c.cost_profile = o.cost_profile;
    c.scheduler.max_num_seqs = o.max_num_seqs;
    c.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
    c.scheduler.max_model_len =
        o.max_model_len > 0 ? o.max_model_len : lm_.config.max_position_embeddings;
    max_model_len_ = c.scheduler.max_model_len;
    c.num_speculative_tokens = o.num_speculative_tokens;
    c.draft_policy.min_confidence = o.speculative_min_confidence;
    c.draft_policy.min_acceptance = o.speculative_min_acceptance;
    core_ = std::make_unique<EngineCore>(*lm_.model, c);
    if (!core_->runner().status().ok()) return;  // Create reports it; no loop runs
    // Servers tokenize rendered chats on their own threads; long prompts spread over this pool.
    tokenize_pool_ = std::make_unique<ThreadPool>(o.threads > 0 ? o.threads : DefaultThreadCount());
    eos_ = lm_.generation.eos_token_ids;
    if (lm_.tokenizer) {
      for (int32_t id : lm_.tokenizer->eos_ids()) eos_.push_back(id);
    }
    loop_ = std::thread([this] { Loop(); });
  }

  ~EngineImpl() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (loop_.joinable()) loop_.join();
  }

  const Status& runner_status() const { return core_->runner().status(); }

  StatusOr<std::shared_ptr<RequestStream>> Submit(const RequestSpec& spec) override {
    std::vector<int32_t> prompt = spec.prompt_ids;
    if (prompt.empty()) {
      if (spec.prompt.empty())
        return InvalidArgument("the request has neither prompt nor prompt_ids");
      if (!lm_.tokenizer) {
        return InvalidArgument("model '{}' has no tokenizer: give the prompt as token ids",
                               lm_.path);
      }
      const auto& tok = *lm_.tokenizer;
      if (tok.add_bos() && tok.bos_id()) prompt.push_back(*tok.bos_id());
      auto ids = tok.Encode(spec.prompt, true);
      prompt.insert(prompt.end(), ids.begin(), ids.end());
    }
    if (spec.sampling.max_tokens < 1) return InvalidArgument("max_tokens must be at least 1");
    if (spec.sampling.n < 1 || spec.sampling.n > 128) {
      return InvalidArgument("n must be in [1, 128], got {}", spec.sampling.n);
    }
    RequestOptions ro;
    ro.sampling.temperature = spec.sampling.temperature;
    ro.sampling.top_p = spec.sampling.top_p;
    ro.sampling.top_k = spec.sampling.top_k;
    ro.sampling.min_p = spec.sampling.min_p;
    ro.has_seed = spec.sampling.seed.has_value();
    ro.sampling.seed = spec.sampling.seed.value_or(0);
    ro.max_tokens = spec.sampling.max_tokens;
    ro.stop_token_ids = spec.sampling.stop_token_ids;
    ro.stop_token_ids.insert(ro.stop_token_ids.end(), eos_.begin(), eos_.end());
    ro.ignore_eos = spec.sampling.ignore_eos;
    ro.sampling.repetition_penalty = spec.sampling.repetition_penalty;
    ro.sampling.presence_penalty = spec.sampling.presence_penalty;
    ro.sampling.frequency_penalty = spec.sampling.frequency_penalty;
    ro.sampling.logit_bias = spec.sampling.logit_bias;
    ro.sampling.min_tokens = spec.sampling.min_tokens;
    ro.sampling.logprobs = spec.sampling.logprobs;
    if (!spec.sampling.structured.type.empty()) {
      auto grammar = CompileStructured(spec.sampling.structured);
      if (!grammar.ok()) return grammar.status();
      ro.grammar = std::move(grammar).value();
    }
    ro.priority = spec.priority;
    ro.cache_salt = spec.cache_salt.empty()
                        ? 0
                        : XXH3_64bits(spec.cache_salt.data(), spec.cache_salt.size()) | 1;
    std::lock_guard<std::mutex> lock(mu_);
    const int n = spec.sampling.n;
    const int64_t id = next_id_;
    next_id_ += n;
    auto stream =
        std::make_shared<Stream>(id, n, lm_.tokenizer.get(), spec.sampling.skip_special_tokens);
    // Completions 1..n-1 follow completion 0: they reuse its prompt blocks from the prefix cache,
    // and draw from seed + i when a seed is given.
    for (int i = 0; i < n; ++i) {
      RequestOptions child = ro;
      if (i > 0) {
        child.follows = id;
        if (child.has_seed) child.sampling.seed = ro.sampling.seed + static_cast<uint64_t>(i);
      }
      inbox_.push_back(Submission{id + i, i, prompt, child, stream});
    }
    cv_.notify_all();
    return std::shared_ptr<RequestStream>(stream);
  }

  void Abort(int64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(id);  // the loop expands it to every completion of the request
    cv_.notify_all();
  }

  EngineStatsSnapshot Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  StatusOr<std::vector<int32_t>> Encode(const std::string& text) const override {
    if (!lm_.tokenizer) return InvalidArgument("model '{}' has no tokenizer", lm_.path);
    return lm_.tokenizer->Encode(text, true);
  }
  std::string Decode(const std::vector<int32_t>& ids) const override {
    return lm_.tokenizer ? lm_.tokenizer->Decode(ids, true) : std::string();
  }
  int64_t vocab_size() const override { return lm_.config.vocab_size; }
  StatusOr<std::vector<int32_t>> EncodeSegments(
      const std::vector<PromptSegment>& segments) const override {
    if (!lm_.tokenizer) return InvalidArgument("model '{}' has no tokenizer", lm_.path);
    return lm_.tokenizer->EncodeSegments(segments, tokenize_pool_.get());
  }
  ModelInfo model_info() const override {
    ModelInfo info;
    info.path = lm_.path;
    info.architecture = lm_.config.arch;
    info.max_model_len = max_model_len_;
    info.vocab_size = lm_.config.vocab_size;
    info.temperature = lm_.generation.temperature;
    info.top_p = lm_.generation.top_p;
    info.top_k = lm_.generation.top_k;
    if (const tokenizer::Tokenizer* tok = lm_.tokenizer.get()) {
      info.chat_template = tok->chat_template();
      info.tool_use_chat_template = tok->tool_use_chat_template();
      if (tok->bos_id()) info.bos_token = tok->TokenBytes(*tok->bos_id());
      info.add_bos_token = tok->add_bos() && tok->bos_id().has_value();
      if (!tok->eos_ids().empty()) info.eos_token = tok->TokenBytes(tok->eos_ids().front());
    }
    return info;
  }

 private:
  // Compiles (or finds cached) the request's grammar on the cache's worker threads; the caller
  // waits, the engine loop does not.
  StatusOr<std::shared_ptr<const structured::CompiledGrammar>> CompileStructured(
      const StructuredOutput& so) {
    if (!lm_.tokenizer) {
      return InvalidArgument("structured output needs the model's tokenizer ('{}' has none)",
                             lm_.path);
    }
    structured::Constraint c;
    DINFER_ASSIGN_OR_RETURN(c.kind, structured::ParseConstraintKind(so.type));
    c.text = so.value;
    c.choices = so.choices;
    c.json.max_whitespace = so.max_whitespace;
    {
      std::lock_guard<std::mutex> lock(grammar_mu_);
      if (!grammars_) {
        grammars_ = std::make_unique<structured::GrammarCache>(
            structured::TokenIndex::FromTokenizer(*lm_.tokenizer, eos_));
      }
    }
    auto result = grammars_->Get(c).get();
    if (!result.ok()) return result.status().WithContext("structured output");
    return result;
  }

  struct Submission {
    int64_t id;
    int index;
    std::vector<int32_t> prompt;
    RequestOptions options;
    std::shared_ptr<Stream> stream;
  };

  void Loop() {
    while (true) {
      std::vector<Submission> subs;
      std::vector<int64_t> aborts;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock,
                 [&] { return stop_ || !inbox_.empty() || !aborts_.empty() || core_->HasWork(); });
        if (stop_) break;
        subs.assign(std::make_move_iterator(inbox_.begin()), std::make_move_iterator(inbox_.end()));
        inbox_.clear();
        aborts.swap(aborts_);
      }
      for (auto& s : subs) {
        const Status st = core_->AddRequest(s.id, std::move(s.prompt), s.options);
        if (!st.ok()) {
          TokenDelta d;
          d.request_id = s.id;
          d.finish = FinishReason::kError;
          d.error = st.message();
          s.stream->Push(s.index, d);
          continue;
        }
        streams_[s.id] = {s.stream, s.index};
      }
      for (int64_t id : aborts) {
        // Every unfinished completion of the request: core ids id, id + 1, ... of its stream.
        std::vector<int64_t> ids;
        for (auto it = streams_.lower_bound(id);
             it != streams_.end() && it->second.first->id() == id; ++it) {
          ids.push_back(it->first);
        }
        for (int64_t core_id : ids) core_->Abort(core_id);
      }
      if (core_->HasWork()) {
        for (const TokenDelta& d : core_->Step()) {
          auto it = streams_.find(d.request_id);
          if (it == streams_.end()) continue;
          it->second.first->Push(it->second.second, d);
          if (d.finish != FinishReason::kNone) streams_.erase(it);
        }
      }
      const EngineStats s = core_->Stats();
      std::lock_guard<std::mutex> lock(mu_);
      stats_.running = s.running;
      stats_.waiting = s.waiting + static_cast<int64_t>(inbox_.size());
      stats_.steps = s.steps;
      stats_.prompt_tokens = s.prompt_tokens;
      stats_.generated_tokens = s.generated_tokens;
      stats_.preemptions = s.preemptions;
      stats_.kv_usage = s.kv.usage;
      stats_.prefix_queries = s.kv.prefix_queries;
      stats_.prefix_hits = s.kv.prefix_hits;
      stats_.prefix_replay_tokens = s.kv.prefix_replayed;
      stats_.draft_tokens = s.draft_tokens;
      stats_.accepted_draft_tokens = s.accepted_draft_tokens;
      stats_.low_confidence_drafts = s.low_confidence_drafts;
      stats_.paused_drafts = s.paused_drafts;
    }
    // Requests still open when the engine stops end as aborted.
    for (auto& [id, entry] : streams_) {
      TokenDelta d;
      d.request_id = id;
      d.finish = FinishReason::kAborted;
      entry.first->Push(entry.second, d);
    }
  }

  LoadedModel lm_;
  std::unique_ptr<EngineCore> core_;
  std::unique_ptr<ThreadPool> tokenize_pool_;
  int64_t max_model_len_ = 0;
  std::vector<int32_t> eos_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Submission> inbox_;
  std::vector<int64_t> aborts_;
  bool stop_ = false;
  int64_t next_id_ = 1;
  EngineStatsSnapshot stats_;
  // Core request id -> its stream and completion index; engine thread only.
  std::map<int64_t, std::pair<std::shared_ptr<Stream>, int>> streams_;
  std::thread loop_;
  std::mutex grammar_mu_;
  std::unique_ptr<structured::GrammarCache> grammars_;
};

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  LoadOptions lo;
  lo.show_progress = options.show_progress;
  DINFER_ASSIGN_OR_RETURN(const Device device, ModelRunner::ParseDevice(options.device));
  DINFER_ASSIGN_OR_RETURN(const KvCacheDType kv_cache_dtype,
                          ParseKvCacheDType(options.kv_cache_dtype));
  DINFER_RETURN_IF_ERROR(ModelRunner::CheckQuantization(options.quantization, device));
  if (options.swa_replay_tokens < 0) {
    return InvalidArgument(
        "swa_replay_tokens must be 0 (the model's exact bound) or positive, got {}",
        options.swa_replay_tokens);
  }
  if (!(options.kv_cache_scale > 0.0)) {
    return InvalidArgument("kv_cache_scale must be positive, got {}", options.kv_cache_scale);
  }
  DINFER_ASSIGN_OR_RETURN(LoadedModel lm, LoadModel(options.model, lo));
  EngineConfig check;
  check.device = device;
  check.num_speculative_tokens = options.num_speculative_tokens;
  check.draft_policy.min_confidence = options.speculative_min_confidence;
  check.draft_policy.min_acceptance = options.speculative_min_acceptance;
  DINFER_RETURN_IF_ERROR(EngineCore::CheckSpeculation(*lm.model, check));
  auto engine = std::make_unique<EngineImpl>(std::move(lm), options, device, kv_cache_dtype);
  if (!engine->runner_status().ok()) return engine->runner_status();
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace dinfer
