#include "engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "base/logging.h"
#include "engine/cost_profile.h"
#include "engine/device_sample.h"
#include "sample/confidence.h"

namespace dinfer {
namespace {

RunnerOptions MakeRunnerOptions(const EngineConfig& c) {
  RunnerOptions o;
  o.block_size = c.block_size;
  o.threads = c.threads;
  o.f32_activations = c.f32_activations;
  o.kv_cache_dtype = c.kv_cache_dtype;
  o.device = c.device;
  o.cuda_dtype = c.cuda_dtype;
  o.kv_scale = c.kv_scale;
  o.cuda_fp8_weights = c.cuda_fp8_weights;
  o.max_seq_len = c.scheduler.max_model_len;
  o.max_num_tokens = c.scheduler.max_num_batched_tokens;
  o.max_num_seqs = c.scheduler.max_num_seqs;
  return o;
}

RunnerOptions MakeRunnerOptions(const kv::KvCacheSpec& spec, const EngineConfig& c) {
  RunnerOptions o = MakeRunnerOptions(c);
  o.num_blocks = spec.num_blocks;
  for (int64_t g = 0; g < spec.num_groups(); ++g)
    o.group_num_blocks.push_back(spec.group(g).num_blocks);
  return o;
}

// Blocks for each KV group. The memory budget is split so that every group holds the same number
// of tokens (each gets its bytes per token's share), except that a sliding-window group next to
// other groups needs no more than its windows and a step's chunks: it gets that much, and the
// rest goes to the others. An explicit block count is group 0's, the others holding as many
// tokens.
kv::KvCacheSpec MakeSpec(const Model& model, const EngineConfig& c) {
  const std::vector<KvGroup> groups = model.KvGroupsFor(c.block_size);
  std::vector<kv::KvGroupSpec> specs;
  for (const KvGroup& g : groups) {
    specs.push_back({0, g.block_size, g.sliding_window, g.entry_rate});
  }
  const int64_t bs0 = groups[0].block_size;
  if (c.num_kv_blocks > 0) {
    const int64_t tokens = (c.num_kv_blocks - 1) * bs0;
    specs[0].num_blocks = c.num_kv_blocks;
    for (size_t g = 1; g < specs.size(); ++g) {
      specs[g].num_blocks = (tokens + specs[g].block_size - 1) / specs[g].block_size + 1;
    }
  } else if (specs.size() == 1) {
    const int64_t per_block = ModelRunner::KvBytesPerBlock(model, MakeRunnerOptions(c))[0];
    specs[0].num_blocks = std::max<int64_t>(2, c.kv_cache_bytes / per_block);
  } else {
    const std::vector<int64_t> per_block =
        ModelRunner::KvBytesPerBlock(model, MakeRunnerOptions(c));
    auto per_token = [&](size_t g) {
      return static_cast<double>(per_block[g]) / static_cast<double>(specs[g].block_size);
    };
    double bytes = static_cast<double>(c.kv_cache_bytes), all = 0;
    for (size_t g = 0; g < specs.size(); ++g) all += per_token(g);
    std::vector<bool> capped(specs.size(), false);
    // Tokens a window group can hold at once: every sequence's window and a block either side,
    // plus a step's chunks (blocks are released after the step that passed them) — two steps'
    // with asynchronous scheduling, which plans the next step while the last one still holds
    // its blocks — and the drafts of speculative decoding.
    const int64_t steps_held = c.async_scheduling ? 2 : 1;
    for (size_t g = 0; g < specs.size(); ++g) {
      const kv::KvGroupSpec& s = specs[g];
      if (s.sliding_window == 0) continue;
      const int64_t cap = c.scheduler.max_num_seqs *
                              (s.sliding_window + 2 * s.block_size + c.num_speculative_tokens) +
                          steps_held * c.scheduler.max_num_batched_tokens;
      if (bytes / all > static_cast<double>(cap)) {
        specs[g].num_blocks = (cap + s.block_size - 1) / s.block_size + 1;
        bytes -= static_cast<double>(specs[g].num_blocks * per_block[g]);
        all -= per_token(g);
        capped[g] = true;
      }
    }
    const double tokens = all > 0 ? std::max(0.0, bytes) / all : 0;
    for (size_t g = 0; g < specs.size(); ++g) {
      if (!capped[g]) {
        specs[g].num_blocks = std::max<int64_t>(
            2, static_cast<int64_t>(tokens / static_cast<double>(specs[g].block_size)));
      }
    }
  }
  kv::KvCacheSpec spec;
  spec.num_blocks = specs[0].num_blocks;
  spec.block_size = specs[0].block_size;
  spec.sliding_window = specs[0].sliding_window;
  spec.enable_prefix_caching = c.enable_prefix_caching;
  spec.extra_groups.assign(specs.begin() + 1, specs.end());
  // Models whose cached prefixes can outlive their window replay (R > 0); the option shortens
  // or lengthens that replay.
  const int64_t exact = model.WindowReplayTokens();
  spec.replay_tokens = exact > 0 && c.swa_replay_tokens > 0 ? c.swa_replay_tokens : exact;
  return spec;
}

// One line per KV group: its blocks and what it costs per token.
void LogKvGroups(const Model& model, const EngineConfig& c) {
  const std::vector<KvGroup> groups = model.KvGroupsFor(c.block_size);
  const std::vector<int64_t> bytes = ModelRunner::KvBytesPerBlock(model, MakeRunnerOptions(c));
  const kv::KvCacheSpec spec = MakeSpec(model, c);
  for (size_t g = 0; g < groups.size() && g < bytes.size(); ++g) {
    const KvGroup& k = groups[g];
    const double per_token = static_cast<double>(bytes[g]) / static_cast<double>(k.block_size);
    log::Info("KV group {}: {} blocks of {} tokens, {} B/block, {:.1f} B/token{}", k.name,
              spec.group(static_cast<int64_t>(g)).num_blocks - 1, k.block_size, bytes[g], per_token,
              k.sliding_window > 0
                  ? fmt::format(" (window {}: released behind it)", k.sliding_window)
                  : "");
  }
}

FinishReason FromSched(sched::FinishReason r) {
  switch (r) {
    case sched::FinishReason::kStop:
      return FinishReason::kStop;
    case sched::FinishReason::kLength:
      return FinishReason::kLength;
    case sched::FinishReason::kAborted:
      return FinishReason::kAborted;
    case sched::FinishReason::kError:
      return FinishReason::kError;
    case sched::FinishReason::kNone:
      break;
  }
  return FinishReason::kNone;
}

}  // namespace

std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

EngineCore::EngineCore(Model& model, const EngineConfig& config)
    : config_(config),
      model_(model),
      kv_(MakeSpec(model, config)),
      scheduler_(config.scheduler, kv_),
      runner_(model, MakeRunnerOptions(kv_.spec(), config)),
      seed_counter_(
          static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())),
      draft_policy_(config.draft_policy) {
  device_sampling_ = config.device_sampling && runner_.SupportsDeviceSampling();
  if (config.num_speculative_tokens > 0) {
    if (Status s = CheckSpeculation(model, config); s.ok()) {
      // Verification decides a step's token count, which the next plan needs: no overlap. It
      // samples each row on the host (one token after another), so logits come back.
      speculative_ = true;
      config_.async_scheduling = false;
      device_sampling_ = false;
    } else {
      log::Error("speculative decoding is off: {}", s.message());
    }
  }
  if (config_.async_scheduling) executor_ = std::make_unique<Executor>(*this);
  if (kv_.num_groups() > 1) LogKvGroups(model, config);
  if (config.scheduler.step_time_budget_s > 0) {
    StatusOr<sched::CostModel> model = Internal("no cost model");
    if (!config.cost_profile.empty()) model = LoadCostModel(config.cost_profile);
    if (!model.ok()) {
      model = ProfileCostModel(runner_, ProfileOptions{});
      if (model.ok() && !config.cost_profile.empty()) {
        if (Status s = SaveCostModel(*model, config.cost_profile); !s.ok())
          log::Warn("{}", s.message());
      }
    }
    if (model.ok()) {
      scheduler_.SetCostModel(*model);
    } else {
      log::Warn("no step cost model ({}): prompt chunks are limited by tokens only",
                model.status().message());
    }
  }
}

Status EngineCore::CheckSpeculation(const Model& model, const EngineConfig& config) {
  const int k = config.num_speculative_tokens;
  DINFER_RETURN_IF_ERROR(sched::DraftPolicy::Validate(config.draft_policy));
  if (k == 0) return OkStatus();
  if (k < 0) return InvalidArgument("num_speculative_tokens must be at least 0, got {}", k);
  if (!model.has_draft_layer()) {
    return InvalidArgument(
        "speculative decoding (num_speculative_tokens {}) needs a model with a draft (MTP) layer; "
        "{} has none: set it to 0",
        k, model.config().arch);
  }
  if (k > 1) {
    return InvalidArgument(
        "num_speculative_tokens {}: the draft (MTP) layer proposes one token per step; use 1", k);
  }
  // A rejected draft inside a block recomputes the block from its start (Resolve): its queries
  // must still find the window behind it, which the blocks released so far leave in place when
  // the window is a multiple of the block size.
  for (const KvGroup& g : model.KvGroupsFor(config.block_size)) {
    if (g.sliding_window > 0 && g.sliding_window % g.block_size != 0) {
      return InvalidArgument(
          "speculative decoding needs the sliding window ({} tokens) to be a multiple of the KV "
          "block size ({} tokens)",
          g.sliding_window, g.block_size);
    }
  }
  return OkStatus();
}

Status EngineCore::AddRequest(int64_t id, std::vector<int32_t> prompt,
                              const RequestOptions& options) {
  const int64_t vocab = model_.config().vocab_size;
  for (int32_t t : prompt) {
    if (t < 0 || t >= vocab) {
      return InvalidArgument("request {}: token id {} is outside the vocabulary [0, {})", id, t,
                             vocab);
    }
  }
  if (Status s = sample::ValidateSamplingParams(options.sampling, vocab); !s.ok()) {
    return s.WithContext(fmt::format("request {}", id));
  }
  sched::SchedRequest r;
  r.id = id;
  r.priority = options.priority;
  r.tokens = std::move(prompt);
  r.max_new_tokens = options.max_tokens;
  r.cache_salt = options.cache_salt;
  r.follows = options.follows;
  DINFER_RETURN_IF_ERROR(scheduler_.Add(std::move(r)));
  sample::SamplingParams sp = options.sampling;
  // min_tokens holds back the stop tokens the engine stops on.
  if (!options.ignore_eos) {
    sp.stop_token_ids.insert(sp.stop_token_ids.end(), options.stop_token_ids.begin(),
                             options.stop_token_ids.end());
  }
  if (!options.has_seed) {
    sp.seed = seed_counter_ = seed_counter_ * 6364136223846793005ull + 1442695040888963407ull;
  }
  auto sampler = std::make_shared<sample::Sampler>(sp);
  sampler->SetPrompt(scheduler_.Find(id)->tokens);
  std::shared_ptr<structured::Matcher> matcher;
  if (options.grammar) matcher = std::make_shared<structured::Matcher>(options.grammar);
  Live live;
  live.options = options;
  live.sampler = std::move(sampler);
  live.matcher = std::move(matcher);
  // Verification samples each row as decoding without drafts would (same sampler state, same
  // random step), so any sampling speculates except what needs more than tokens per row:
  // logprobs of the accepted drafts' successors and grammar masks of rows after a draft.
  live.speculate = speculative_ && sp.logprobs < 0 && !live.matcher;
  live_.emplace(id, std::move(live));
  return OkStatus();
}

void EngineCore::Abort(int64_t id) {
  if (live_.count(id) == 0) return;
  FinishRequest(id, FinishReason::kAborted, "", pending_);
}

void EngineCore::FinishRequest(int64_t id, FinishReason reason, std::string error,
                               std::vector<TokenDelta>& out) {
  const sched::SchedRequest* r = scheduler_.Find(id);
  auto live = live_.find(id);
  TokenDelta d;
  d.request_id = id;
  d.finish = reason;
  d.error = error;
  if (r != nullptr) {
    d.num_prompt_tokens = r->num_prompt_tokens;
    d.num_cached_tokens = r->num_cached_tokens;
    if (live != live_.end()) {
      const auto gen = r->tokens.begin() + r->num_prompt_tokens;
      // Up to the last known token: a placeholder of an in-flight step is not reported.
      const auto end = std::find(gen, r->tokens.end(), sched::kPlaceholderToken);
      d.tokens.assign(gen + static_cast<int64_t>(live->second.reported), end);
      d.logprobs = std::move(live->second.logprobs);
      d.logprobs.resize(std::min(d.logprobs.size(), d.tokens.size()));
    }
  }
  const sched::FinishReason sr = reason == FinishReason::kStop      ? sched::FinishReason::kStop
                                 : reason == FinishReason::kLength  ? sched::FinishReason::kLength
                                 : reason == FinishReason::kAborted ? sched::FinishReason::kAborted
                                                                    : sched::FinishReason::kError;
  scheduler_.Finish(id, sr, std::move(error));
  scheduler_.Release(id);
  if (live != live_.end()) live_.erase(live);
  out.push_back(std::move(d));
}

// Runs step jobs on its own thread, one at a time, in submission order.
class EngineCore::Executor {
 public:
  explicit Executor(EngineCore& core) : core_(core), thread_([this] { Loop(); }) {}
  ~Executor() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Launch(StepJob job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = std::move(job);
      result_.reset();
    }
    cv_.notify_all();
  }
  StepResult Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return result_.has_value(); });
    StepResult r = std::move(*result_);
    result_.reset();
    return r;
  }

 private:
  void Loop() {
    while (true) {
      StepJob job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || job_.has_value(); });
        if (stop_) return;
        job = std::move(*job_);
        job_.reset();
      }
      StepResult r = core_.RunJob(job);
      {
        std::lock_guard<std::mutex> lock(mu_);
        result_ = std::move(r);
      }
      cv_.notify_all();
    }
  }

  EngineCore& core_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<StepJob> job_;
  std::optional<StepResult> result_;
  bool stop_ = false;
  std::thread thread_;
};

EngineCore::~EngineCore() {
  if (inflight_) executor_->Wait();
}

EngineCore::StepJob EngineCore::BuildJob(const sched::StepPlan& plan) {
  StepJob job;
  job.tokens.reserve(plan.chunks.size());
  job.tables.reserve(plan.chunks.size() * static_cast<size_t>(kv_.num_groups()));
  for (const auto& c : plan.chunks) {
    const sched::SchedRequest* r = scheduler_.Find(c.id);
    const auto first = r->tokens.begin() + c.start_pos;
    job.tokens.emplace_back(first, first + c.num_tokens);
    job.tokens.back().insert(job.tokens.back().end(), c.draft.begin(), c.draft.end());
    if (speculative_) job.next.emplace_back(first + 1, first + c.num_tokens + 1);
    const auto table = kv_.BlockTable(c.id);
    job.tables.emplace_back(table.begin(), table.end());
    SeqChunk s;
    s.tokens = job.tokens.back();
    s.start_pos = c.start_pos;
    s.block_table = job.tables.back();
    if (kv_.num_groups() > 1) {
      std::vector<std::span<const int32_t>> groups;
      for (int64_t g = 1; g < kv_.num_groups(); ++g) {
        const auto group_table = kv_.BlockTable(c.id, g);
        job.tables.emplace_back(group_table.begin(), group_table.end());
        groups.push_back(job.tables.back());
      }
      job.group_tables.push_back(std::move(groups));
      s.group_tables = job.group_tables.back();
    }
    s.replay_end = c.replay_end;
    s.logits = !c.draft.empty() ? SeqChunk::Logits::kAll
               : c.sample       ? SeqChunk::Logits::kLast
                                : SeqChunk::Logits::kNone;
    job.chunks.push_back(s);
    if (c.sample) {
      const Live& live = live_.at(c.id);
      job.drafts.push_back(c.draft);
      job.speculate.push_back(live.speculate);
      job.num_tokens.push_back(c.num_tokens);
      job.samplers.push_back(live.sampler);
      job.matchers.push_back(live.matcher);
      // This step's token goes to position start + count; the ones before it were generated.
      const int64_t generated = c.start_pos + c.num_tokens - r->num_prompt_tokens;
      job.remaining.push_back(r->max_new_tokens - generated);
    }
    if (c.start_pos < r->num_prompt_tokens) {
      stats_.prompt_tokens += std::min(c.num_tokens, r->num_prompt_tokens - c.start_pos);
    }
  }
  return job;
}

EngineCore::StepResult EngineCore::RunJob(const StepJob& job) {
  StepResult result;
  // Grammar masks of the constrained requests are filled while the forward pass runs: they depend
  // only on the tokens accepted before this step.
  std::vector<std::vector<uint32_t>> masks(job.matchers.size());
  std::future<void> masking;
  if (std::any_of(job.matchers.begin(), job.matchers.end(), [](const auto& m) { return m; })) {
    masking = std::async(std::launch::async, [&] {
      for (size_t i = 0; i < job.matchers.size(); ++i) {
        if (!job.matchers[i]) continue;
        masks[i].resize(structured::BitmaskWords(job.matchers[i]->vocab_size()));
        // Near the token limit the grammar steers to a shortest completion.
        job.matchers[i]->FillNextTokenBitmask(masks[i].data(), job.remaining[i]);
      }
    });
  }
  if (device_sampling_) return RunJobOnDevice(job, masks, masking);
  auto logits = runner_.Execute(job.chunks);
  if (masking.valid()) masking.get();
  if (!logits.ok()) {
    result.status = logits.status();
    return result;
  }
  const int64_t vocab = model_.config().vocab_size;
  result.errors.resize(job.samplers.size());
  int64_t row = 0;  // a chunk with drafts has a row per token, the others one
  for (size_t i = 0; i < job.samplers.size(); ++i) {
    sample::Sampler& s = *job.samplers[i];
    const bool drafts = speculative_ && !job.drafts[i].empty();
    const int64_t n = drafts ? job.num_tokens[i] : 1;
    float* row_data = logits->as<float>() + (row + n - 1) * vocab;
    row += drafts ? n + static_cast<int64_t>(job.drafts[i].size()) : 1;
    if (job.matchers[i]) {
      // Tokens the grammar does not allow (and ids past the tokenizer's vocabulary) get -inf.
      const int64_t known = job.matchers[i]->vocab_size();
      bool any = false;
      for (int64_t t = 0; t < vocab; ++t) {
        const bool allowed =
            t < known && structured::TestBit(masks[i].data(), static_cast<int32_t>(t));
        if (!allowed) row_data[t] = -INFINITY;
        any |= allowed;
      }
      if (!any) {
        result.errors[i] = "structured output: the grammar allows no next token";
        result.logprobs.emplace_back();
        result.sampled.push_back(0);
        continue;
      }
    }
    const std::span<const float> row(row_data, static_cast<size_t>(vocab));
    if (s.params().logprobs >= 0) {
      result.logprobs.push_back(s.SampleWithLogprobs(row));
      result.sampled.push_back(result.logprobs.back().token);
    } else {
      result.logprobs.emplace_back();
      result.sampled.push_back(s.Sample(row));
    }
  }
  if (speculative_) result.status = VerifyAndDraft(job, *logits, result);
  return result;
}

Status EngineCore::VerifyAndDraft(const StepJob& job, const TensorView& logits,
                                  StepResult& result) {
  const int64_t vocab = model_.config().vocab_size;
  const float* all = logits.as<float>();
  result.extra.assign(job.samplers.size(), {});
  result.proposals.assign(job.samplers.size(), {});
  result.confidences.assign(job.samplers.size(), 0.0f);
  // Verification: a draft is accepted while the token sampled before it equals it; the row after
  // an accepted draft then gives one more token. Stops and the token limit end the run. Each row
  // is sampled with the sampler holding every token before it (accepted here, one at a time, so
  // penalties and min_tokens see them) and with the next random step, exactly as decoding without
  // drafts samples it: the outputs are the same token for token, greedy or not. For a sampled
  // request this is speculative sampling with a one-token draft distribution: the draft d is
  // accepted with probability p(d) and otherwise the token comes from p without d, renormalized.
  int64_t first_row = 0;
  for (size_t i = 0; i < job.samplers.size(); ++i) {
    const std::vector<int32_t>& draft = job.drafts[i];
    const int64_t n = draft.empty() ? 1 : job.num_tokens[i];  // rows up to the sampled one
    const auto& stops = job.samplers[i]->params().stop_token_ids;
    int32_t last = result.sampled[i];
    for (size_t j = 0; j < draft.size() && result.errors[i].empty(); ++j) {
      const bool stop = std::find(stops.begin(), stops.end(), last) != stops.end();
      const auto emitted = static_cast<int64_t>(result.extra[i].size()) + 1;
      if (last != draft[j] || stop || emitted >= job.remaining[i]) break;
      const float* r = all + (first_row + n + static_cast<int64_t>(j)) * vocab;
      job.samplers[i]->Accept(last);  // Resolve accepts only the last emitted token
      last = job.samplers[i]->Sample(std::span<const float>(r, static_cast<size_t>(vocab)));
      result.extra[i].push_back(last);
    }
    first_row += n + static_cast<int64_t>(draft.size());
  }
  // The draft layer over every row of the forward pass (its KV must hold every position): row t
  // takes the token after token t, the sampled or accepted one at the end of a sampling chunk.
  std::vector<std::vector<int32_t>> next = job.next;
  std::vector<SeqChunk> chunks = job.chunks;
  std::vector<int64_t> sampling(chunks.size(), -1);     // per chunk: its sampling index, or -1
  std::vector<int64_t> wanted(job.samplers.size(), 0);  // per sampling chunk: its draft's row
  size_t si = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    std::vector<int32_t>& n = next[c];
    if (chunks[c].logits != SeqChunk::Logits::kNone) {
      sampling[c] = static_cast<int64_t>(si);
      const size_t base = n.size() - 1;  // the sampled token's slot, before the drafts
      n.resize(chunks[c].tokens.size());
      const std::vector<int32_t>& extra = result.extra[si];
      n[base] = result.sampled[si];
      for (size_t j = 0; j < extra.size(); ++j) n[base + 1 + j] = extra[j];
      for (size_t j = base + 1 + extra.size(); j < n.size(); ++j) n[j] = n[base + extra.size()];
      wanted[si] = chunks[c].logits == SeqChunk::Logits::kAll
                       ? static_cast<int64_t>(base + extra.size())
                       : 0;
      if (!job.speculate[si] || !result.errors[si].empty()) {
        chunks[c].logits = SeqChunk::Logits::kNone;
      }
      ++si;
    }
    chunks[c].tokens = n;
  }
  DINFER_ASSIGN_OR_RETURN(const TensorView draft_logits, runner_.ExecuteDraft(chunks));
  int64_t row = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (chunks[c].logits == SeqChunk::Logits::kNone) continue;
    const auto i = static_cast<size_t>(sampling[c]);
    const float* r = draft_logits.as<float>() + (row + wanted[i]) * vocab;
    const sample::TopToken top =
        sample::ArgmaxProbability(std::span<const float>(r, static_cast<size_t>(vocab)));
    result.proposals[i] = {top.token};
    result.confidences[i] = top.probability;
    row += chunks[c].logits == SeqChunk::Logits::kAll
               ? static_cast<int64_t>(chunks[c].tokens.size())
               : 1;
  }
  return OkStatus();
}

namespace {

// Whether a grammar mask allows any token below `vocab`.
bool AnyAllowed(const std::vector<uint32_t>& mask, int64_t known, int64_t vocab) {
  const int64_t n = std::min(known, vocab);
  for (int64_t w = 0; w < n / 32; ++w) {
    if (mask[static_cast<size_t>(w)] != 0) return true;
  }
  for (int64_t t = n / 32 * 32; t < n; ++t) {
    if (structured::TestBit(mask.data(), static_cast<int32_t>(t))) return true;
  }
  return false;
}

}  // namespace

EngineCore::StepResult EngineCore::RunJobOnDevice(const StepJob& job,
                                                  std::vector<std::vector<uint32_t>>& masks,
                                                  std::future<void>& masking) {
  StepResult result;
  const int64_t vocab = model_.config().vocab_size;
  result.errors.resize(job.samplers.size());
  auto out = runner_.ExecuteAndSample(job.chunks, [&](DeviceSampleBatch& b) -> Status {
    // The masks are uploaded once the helper has filled them; the forward pass runs meanwhile.
    if (masking.valid()) masking.get();
    for (size_t i = 0; i < job.samplers.size(); ++i) {
      AppendDeviceSampleRow(*job.samplers[i], b);
      if (!job.matchers[i]) continue;
      const int64_t known = job.matchers[i]->vocab_size();
      if (!AnyAllowed(masks[i], known, vocab)) {
        result.errors[i] = "structured output: the grammar allows no next token";
        continue;
      }
      DeviceSampleRow& r = b.rows.back();
      r.mask_offset = static_cast<int64_t>(b.masks.size());
      r.mask_vocab = static_cast<int32_t>(std::min(known, vocab));
      b.masks.insert(b.masks.end(), masks[i].begin(), masks[i].end());
    }
    return OkStatus();
  });
  if (masking.valid()) masking.get();
  if (!out.ok()) {
    result.status = out.status();
    return result;
  }
  constexpr size_t kTop = DeviceSampleOutput::kTopStride;
  for (size_t i = 0; i < job.samplers.size(); ++i) {
    const int32_t token = result.errors[i].empty() ? out->tokens[i] : 0;
    result.sampled.push_back(token);
    result.logprobs.emplace_back();
    const int n = job.samplers[i]->params().logprobs;
    if (n < 0 || !result.errors[i].empty()) continue;
    sample::SampleResult& lp = result.logprobs.back();
    lp.token = token;
    lp.logprob = out->logprobs[i];
    for (size_t j = 0; j < std::min<size_t>(static_cast<size_t>(n), kTop); ++j) {
      const int32_t t = out->top_tokens[i * kTop + j];
      if (t < 0) break;
      lp.top.emplace_back(t, out->top_logprobs[i * kTop + j]);
    }
    // As the CPU sampler orders them: logprob descending, then token ascending.
    std::sort(lp.top.begin(), lp.top.end(), [](const auto& a, const auto& b) {
      return a.second != b.second ? a.second > b.second : a.first < b.first;
    });
  }
  return result;
}

void EngineCore::Resolve(const sched::StepPlan& plan, const StepResult& result) {
  if (!result.status.ok()) return;
  scheduler_.ResolveSamples(plan, result.sampled);
  size_t i = 0;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    auto it = live_.find(c.id);
    if (speculative_ && it != live_.end()) {
      const std::vector<int32_t>& extra = result.extra[i];
      sched::DraftPolicy::State& drafting = it->second.drafting;
      if (!c.draft.empty()) {
        stats_.draft_tokens += static_cast<int64_t>(c.draft.size());
        stats_.accepted_draft_tokens += static_cast<int64_t>(extra.size());
        draft_policy_.OnVerified(drafting, static_cast<int64_t>(c.draft.size()),
                                 static_cast<int64_t>(extra.size()));
      }
      // KV is valid up to the first rejected draft. Rewriting a position does not undo what it
      // added to state kept per block (DeepSeek-V4's compressors keep the state after each
      // block's last computed token), so a rejection inside a block recomputes that block from
      // its start, which reads only the state of the blocks before it.
      const int64_t valid = c.start_pos + c.num_tokens + static_cast<int64_t>(extra.size());
      int64_t computed = valid;
      if (extra.size() < c.draft.size()) computed = valid / config_.block_size * config_.block_size;
      scheduler_.ResolveDraft(c, extra, computed);
      std::vector<int32_t> proposal = result.proposals[i];
      if (!proposal.empty()) {
        const auto decision = draft_policy_.Decide(drafting, result.confidences[i]);
        if (decision != sched::DraftPolicy::Decision::kPropose) {
          (decision == sched::DraftPolicy::Decision::kLowConfidence ? stats_.low_confidence_drafts
                                                                    : stats_.paused_drafts) +=
              static_cast<int64_t>(proposal.size());
          proposal.clear();
        }
      }
      scheduler_.SetDraft(c.id, std::move(proposal));
    }
    if (it != live_.end()) {
      // Verification accepted every emitted token but the last (VerifyAndDraft).
      const bool extra = speculative_ && !result.extra[i].empty();
      it->second.sampler->Accept(extra ? result.extra[i].back() : result.sampled[i]);
      // Masked sampling only draws allowed tokens; the matcher follows them.
      if (structured::Matcher* m = it->second.matcher.get(); m && result.errors[i].empty()) {
        if (!m->AcceptToken(result.sampled[i])) {
          it->second.grammar_error =
              fmt::format("structured output: token {} is not allowed", result.sampled[i]);
        }
        it->second.grammar_done = m->IsTerminated();
      }
      if (it->second.options.sampling.logprobs >= 0) {
        it->second.logprobs.push_back(result.logprobs[i]);
      }
    }
    ++i;
  }
}

void EngineCore::PostProcess(const sched::StepPlan& plan, const StepResult& result,
                             std::vector<TokenDelta>& out) {
  if (!result.status.ok()) {
    log::Error("step failed: {}", result.status.ToString());
    for (const auto& c : plan.chunks) {
      if (live_.count(c.id) != 0) {
        FinishRequest(c.id, FinishReason::kError, result.status.ToString(), out);
      }
    }
    return;
  }
  scheduler_.OnStepDone(plan);
  stats_.generated_tokens += static_cast<int64_t>(result.sampled.size());
  for (const auto& extra : result.extra)
    stats_.generated_tokens += static_cast<int64_t>(extra.size());
  size_t sample_index = 0;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    const size_t index = sample_index++;
    const std::string& error = result.errors[index];
    const sched::SchedRequest* r = scheduler_.Find(c.id);
    auto it = live_.find(c.id);
    if (r == nullptr || it == live_.end()) continue;
    Live& live = it->second;
    if (!error.empty() || !live.grammar_error.empty()) {
      FinishRequest(c.id, FinishReason::kError, error.empty() ? live.grammar_error : error, out);
      continue;
    }
    // Where this step's last token went (verified drafts emit more than one; only the last can
    // be a stop token).
    const int64_t pos = c.start_pos + c.num_tokens +
                        (speculative_ ? static_cast<int64_t>(result.extra[index].size()) : 0);
    const int32_t token = r->tokens[static_cast<size_t>(pos)];
    const auto& stops = live.options.stop_token_ids;
    const bool stop =
        !live.options.ignore_eos && std::find(stops.begin(), stops.end(), token) != stops.end();
    if (r->state == sched::RequestState::kFinished || stop) {
      FinishRequest(c.id, stop ? FinishReason::kStop : FromSched(r->finish), "", out);
      continue;
    }
    // The grammar is complete and allows nothing more: the output is done.
    if (live.grammar_done) {
      FinishRequest(c.id, FinishReason::kStop, "", out);
      continue;
    }
    TokenDelta d;
    d.request_id = c.id;
    d.tokens.assign(r->tokens.begin() + r->num_prompt_tokens + static_cast<int64_t>(live.reported),
                    r->tokens.begin() + pos + 1);
    live.reported += d.tokens.size();
    d.logprobs = std::move(live.logprobs);
    live.logprobs.clear();
    d.num_prompt_tokens = r->num_prompt_tokens;
    d.num_cached_tokens = r->num_cached_tokens;
    out.push_back(std::move(d));
  }
}

std::vector<TokenDelta> EngineCore::Step() {
  std::vector<TokenDelta> out = std::move(pending_);
  pending_.clear();
  // Plan step N+1 while step N (if any) computes.
  sched::StepPlan plan = scheduler_.Schedule();
  for (int64_t id : plan.failed) {
    const sched::SchedRequest* r = scheduler_.Find(id);
    FinishRequest(id, FinishReason::kError, r != nullptr ? r->error : "failed", out);
  }
  stats_.preemptions += static_cast<int64_t>(plan.preempted.size());
  std::optional<StepResult> previous;
  if (inflight_) {
    previous = executor_->Wait();
    Resolve(*inflight_, *previous);
  }
  std::optional<StepResult> now;
  if (!plan.empty()) {
    ++stats_.steps;
    stats_.computed_tokens += plan.num_tokens;
    StepJob job = BuildJob(plan);
    if (config_.async_scheduling) {
      executor_->Launch(std::move(job));
    } else {
      now = RunJob(job);
    }
  }
  // Post-process step N while step N+1 computes.
  if (previous) PostProcess(*inflight_, *previous, out);
  inflight_.reset();
  if (now) {
    Resolve(plan, *now);
    PostProcess(plan, *now, out);
  } else if (!plan.empty()) {
    inflight_ = std::move(plan);
  }
  return out;
}

EngineStats EngineCore::Stats() const {
  EngineStats s = stats_;
  s.running = scheduler_.num_running();
  s.waiting = scheduler_.num_waiting();
  s.kv = kv_.Stats();
  return s;
}

}  // namespace dinfer
