#include "engine/engine_core.h"

#include <algorithm>
#include <chrono>

#include "base/logging.h"
#include "engine/cost_profile.h"

namespace dinfer {
namespace {

kv::KvCacheSpec MakeSpec(const Model& model, const EngineConfig& c) {
  kv::KvCacheSpec spec;
  spec.block_size = c.block_size;
  spec.enable_prefix_caching = c.enable_prefix_caching;
  const ModelConfig& mc = model.config();
  const bool all_sliding =
      mc.sliding_window > 0 &&
      std::all_of(mc.layer_sliding.begin(), mc.layer_sliding.end(), [](bool b) { return b; });
  spec.sliding_window = all_sliding ? mc.sliding_window : 0;
  spec.num_blocks = c.num_kv_blocks;
  if (spec.num_blocks <= 0) {
    const int64_t per_block = KvStorage::BytesPerBlock(mc.num_layers, c.block_size, model.kv_dim());
    spec.num_blocks = std::max<int64_t>(2, c.kv_cache_bytes / per_block);
  }
  return spec;
}

RunnerOptions MakeRunnerOptions(const kv::KvCacheSpec& spec, const EngineConfig& c) {
  RunnerOptions o;
  o.num_blocks = spec.num_blocks;
  o.block_size = spec.block_size;
  o.threads = c.threads;
  o.f32_activations = c.f32_activations;
  return o;
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
          static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())) {
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

Status EngineCore::AddRequest(int64_t id, std::vector<int32_t> prompt,
                              const RequestOptions& options) {
  const int64_t vocab = model_.config().vocab_size;
  for (int32_t t : prompt) {
    if (t < 0 || t >= vocab) {
      return InvalidArgument("request {}: token id {} is outside the vocabulary [0, {})", id, t,
                             vocab);
    }
  }
  if (options.sampling.temperature < 0) {
    return InvalidArgument("request {}: temperature must be >= 0", id);
  }
  if (options.sampling.top_p <= 0 || options.sampling.top_p > 1) {
    return InvalidArgument("request {}: top_p must be in (0, 1]", id);
  }
  sched::SchedRequest r;
  r.id = id;
  r.priority = options.priority;
  r.tokens = std::move(prompt);
  r.max_new_tokens = options.max_tokens;
  r.cache_salt = options.cache_salt;
  DINFER_RETURN_IF_ERROR(scheduler_.Add(std::move(r)));
  sample::SamplingParams sp = options.sampling;
  if (!options.has_seed)
    sp.seed = seed_counter_ = seed_counter_ * 6364136223846793005ull + 1442695040888963407ull;
  live_.emplace(id, Live{options, sample::Sampler(sp), 0});
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
      d.tokens.assign(gen + static_cast<int64_t>(live->second.reported), r->tokens.end());
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

std::vector<TokenDelta> EngineCore::Step() {
  std::vector<TokenDelta> out = std::move(pending_);
  pending_.clear();
  sched::StepPlan plan = scheduler_.Schedule();
  for (int64_t id : plan.failed) {
    const sched::SchedRequest* r = scheduler_.Find(id);
    FinishRequest(id, FinishReason::kError, r != nullptr ? r->error : "failed", out);
  }
  stats_.preemptions += static_cast<int64_t>(plan.preempted.size());
  if (plan.empty()) return out;
  ++stats_.steps;

  std::vector<SeqChunk> chunks;
  chunks.reserve(plan.chunks.size());
  for (const auto& c : plan.chunks) {
    const sched::SchedRequest* r = scheduler_.Find(c.id);
    SeqChunk s;
    s.tokens = std::span<const int32_t>(r->tokens).subspan(c.start_pos, c.num_tokens);
    s.start_pos = c.start_pos;
    s.block_table = kv_.BlockTable(c.id);
    s.logits = c.sample ? SeqChunk::Logits::kLast : SeqChunk::Logits::kNone;
    chunks.push_back(s);
    if (c.start_pos < r->num_prompt_tokens) {
      stats_.prompt_tokens += std::min(c.num_tokens, r->num_prompt_tokens - c.start_pos);
    }
  }
  auto logits = runner_.Execute(chunks);
  if (!logits.ok()) {
    log::Error("step failed: {}", logits.status().ToString());
    for (const auto& c : plan.chunks) {
      FinishRequest(c.id, FinishReason::kError, logits.status().ToString(), out);
    }
    return out;
  }
  const int64_t vocab = model_.config().vocab_size;
  std::vector<int32_t> sampled;
  int64_t row = 0;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    Live& live = live_.at(c.id);
    sampled.push_back(live.sampler.Sample(
        std::span<const float>(logits->as<float>() + row * vocab, static_cast<size_t>(vocab))));
    ++row;
  }
  scheduler_.OnStepDone(plan, sampled);
  stats_.generated_tokens += static_cast<int64_t>(sampled.size());

  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    const sched::SchedRequest* r = scheduler_.Find(c.id);
    auto it = live_.find(c.id);
    if (r == nullptr || it == live_.end()) continue;
    Live& live = it->second;
    const int32_t last = r->tokens.back();
    const auto& stops = live.options.stop_token_ids;
    const bool stop =
        !live.options.ignore_eos && std::find(stops.begin(), stops.end(), last) != stops.end();
    if (r->state == sched::RequestState::kFinished || stop) {
      FinishRequest(c.id, stop ? FinishReason::kStop : FromSched(r->finish), "", out);
      continue;
    }
    TokenDelta d;
    d.request_id = c.id;
    d.tokens.assign(r->tokens.begin() + r->num_prompt_tokens + static_cast<int64_t>(live.reported),
                    r->tokens.end());
    live.reported += d.tokens.size();
    d.num_prompt_tokens = r->num_prompt_tokens;
    d.num_cached_tokens = r->num_cached_tokens;
    out.push_back(std::move(d));
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
