#include "sched/scheduler.h"

#include <algorithm>

namespace dinfer::sched {
namespace {

constexpr int64_t kMaxStepTokens = 32768;

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, kv::KvCacheManager& kv)
    : config_(config), kv_(kv) {
  config_.max_num_batched_tokens =
      std::clamp<int64_t>(config_.max_num_batched_tokens, 1, kMaxStepTokens);
  config_.max_num_seqs = std::max<int64_t>(1, config_.max_num_seqs);
}

bool Scheduler::Before(const SchedRequest& a, const SchedRequest& b) const {
  return a.priority != b.priority ? a.priority < b.priority : a.arrival < b.arrival;
}

Status Scheduler::Add(SchedRequest r) {
  if (requests_.count(r.id) != 0) return InvalidArgument("request id {} is already in use", r.id);
  if (r.tokens.empty()) return InvalidArgument("request {}: the prompt is empty", r.id);
  if (r.max_new_tokens < 1)
    return InvalidArgument("request {}: max tokens must be at least 1", r.id);
  const int64_t total = r.num_tokens() + r.max_new_tokens;
  if (total > config_.max_model_len) {
    return InvalidArgument(
        "request {}: prompt ({} tokens) + max tokens ({}) exceed the model length of {} tokens",
        r.id, r.num_tokens(), r.max_new_tokens, config_.max_model_len);
  }
  if (Status fits = kv_.CheckCanEverHold(total); !fits.ok()) {
    return MakeError(StatusCode::kResourceExhausted, "request {}: {}", r.id, fits.message());
  }
  r.num_prompt_tokens = r.num_tokens();
  r.arrival = next_arrival_++;
  r.state = RequestState::kWaiting;
  r.num_computed_tokens = 0;
  const RequestId id = r.id;
  requests_.emplace(id, std::move(r));
  const SchedRequest& added = requests_.at(id);
  auto pos = std::find_if(waiting_.begin(), waiting_.end(),
                          [&](RequestId w) { return Before(added, requests_.at(w)); });
  waiting_.insert(pos, id);
  return OkStatus();
}

const SchedRequest* Scheduler::Find(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

int64_t Scheduler::ChunkLimit(int64_t budget, int64_t context, const StepPlan& plan) const {
  int64_t limit = budget;
  if (cost_model_ && config_.step_time_budget_s > 0) {
    const double left =
        config_.step_time_budget_s - std::max(plan.predicted_time_s, cost_model_->fixed());
    const int64_t by_time = cost_model_->MaxTokens(left, static_cast<double>(context), limit);
    // Progress even when the budget is tight: a chunk of at least min_chunk_tokens.
    limit = std::min(limit, std::max(by_time, config_.min_chunk_tokens));
  }
  return limit;
}

void Scheduler::Preempt(RequestId id, StepPlan& plan) {
  SchedRequest& r = requests_.at(id);
  kv_.Free(id);
  r.state = RequestState::kWaiting;
  r.num_computed_tokens = 0;
  r.num_done_tokens = 0;
  r.num_cached_tokens = 0;
  ++r.num_preemptions;
  r.draft.clear();
  running_.erase(std::find(running_.begin(), running_.end(), id));
  auto pos = std::find_if(waiting_.begin(), waiting_.end(),
                          [&](RequestId w) { return Before(r, requests_.at(w)); });
  waiting_.insert(pos, id);
  // A chunk already planned for it this step is dropped.
  auto it = std::find_if(plan.chunks.begin(), plan.chunks.end(),
                         [&](const ScheduledChunk& c) { return c.id == id; });
  if (it != plan.chunks.end()) {
    plan.num_tokens -= it->num_tokens + static_cast<int64_t>(it->draft.size());
    plan.chunks.erase(it);
  }
  plan.preempted.push_back(id);
}

void Scheduler::Fail(SchedRequest& r, std::string error, StepPlan& plan) {
  plan.failed.push_back(r.id);
  Finish(r.id, FinishReason::kError, std::move(error));
}

StepPlan Scheduler::Schedule() {
  StepPlan plan;
  int64_t budget = config_.max_num_batched_tokens;
  // n tokens of the request, and the draft tokens riding along after them.
  auto add_chunk = [&](SchedRequest& r, int64_t n, std::vector<int32_t> draft = {}) {
    const bool sample = r.num_computed_tokens + n == r.num_tokens();
    // Until it reaches its hit, a replaying request recomputes window KV only.
    const int64_t replay_end =
        r.num_computed_tokens < r.num_cached_tokens ? r.num_cached_tokens : 0;
    const auto k = static_cast<int64_t>(draft.size());
    plan.chunks.push_back({r.id, r.num_computed_tokens, n, sample, replay_end, std::move(draft)});
    if (sample) r.tokens.push_back(kPlaceholderToken);
    if (cost_model_) {
      plan.predicted_time_s =
          (plan.chunks.size() == 1 ? cost_model_->fixed() : plan.predicted_time_s) +
          cost_model_->Marginal(static_cast<double>(n), static_cast<double>(r.num_computed_tokens));
    }
    r.num_computed_tokens += n;
    plan.num_tokens += n + k;
    budget -= n + k;
  };

  // 1. Running requests, highest priority first; decodes always run.
  const std::vector<RequestId> order = running_;
  for (RequestId id : order) {
    SchedRequest& r = requests_.at(id);
    if (r.state != RequestState::kRunning || budget <= 0) continue;
    int64_t n = r.num_pending();
    // Nothing to compute, or the in-flight step samples its last allowed token.
    if (n <= 0 || r.num_generated() >= r.max_new_tokens) continue;
    const bool decode = r.num_computed_tokens >= r.num_prompt_tokens;
    if (!decode) n = std::min(n, ChunkLimit(budget, r.num_computed_tokens, plan));
    n = std::min(n, budget);
    if (n <= 0) continue;
    // Drafts ride along a chunk that reaches the last token (a decode, or the recomputation
    // after a rejected draft) when the request may generate them all.
    std::vector<int32_t> draft = std::move(r.draft);
    r.draft.clear();
    const auto k = static_cast<int64_t>(draft.size());
    if (n != r.num_pending() || r.num_generated() + 1 + k > r.max_new_tokens || n + k > budget) {
      draft.clear();
    }
    const int64_t with_draft = n + static_cast<int64_t>(draft.size());
    const int64_t need = r.num_computed_tokens + with_draft;
    bool self_preempted = false;
    while (!kv_.Allocate(id, need)) {
      const RequestId victim = running_.back();
      Preempt(victim, plan);
      if (victim == id) {
        self_preempted = true;
        break;
      }
    }
    if (!self_preempted) {
      add_chunk(r, n, std::move(draft));
    } else if (running_.empty() && plan.chunks.empty() && !r.has_placeholder()) {
      // Alone, with nothing else holding memory, it cannot take this step: readmitted, it would
      // come back to the same point and preempt itself again, forever.
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
      Fail(r,
           fmt::format("request {} cannot continue: the KV cache cannot hold {} tokens of it "
                       "even alone",
                       id, need),
           plan);
    }
  }

  // 2. Waiting requests by priority and arrival, while there is room; none after a preemption
  // (memory is short) and none past the first that does not fit (no overtaking).
  // A request that follows another (a sibling of n > 1) waits until that one's prompt is
  // computed, so it finds the prompt's blocks in the prefix cache instead of computing them.
  size_t next = 0;
  while (plan.preempted.empty() && next < waiting_.size() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
    const RequestId id = waiting_[next];
    SchedRequest& r = requests_.at(id);
    if (r.follows != 0) {
      auto leader = requests_.find(r.follows);
      if (leader != requests_.end() && leader->second.state != RequestState::kFinished &&
          leader->second.num_done_tokens < leader->second.num_prompt_tokens) {
        ++next;
        continue;
      }
    }
    if (r.has_placeholder()) break;  // preempted while a step samples its next token
    // A replay hit's tokens [S, T) are budgeted like prompt tokens: computation starts at S.
    const kv::PrefixHit hit = kv_.Match(r.tokens, r.cache_salt);
    const int64_t start = hit.replay_start;
    const int64_t n = std::min(r.num_tokens() - start, ChunkLimit(budget, start, plan));
    if (n <= 0) break;
    if (!kv_.Allocate(id, start + n, r.tokens, r.cache_salt, hit.num_cached_tokens)) {
      if (running_.empty() && plan.chunks.empty()) {
        // Nothing else holds memory, yet it cannot start: it never will.
        waiting_.erase(waiting_.begin() + static_cast<int64_t>(next));
        Fail(r,
             fmt::format("request {} cannot be admitted: the KV cache cannot hold its first {} "
                         "tokens",
                         id, start + n),
             plan);
        continue;
      }
      break;
    }
    waiting_.erase(waiting_.begin() + static_cast<int64_t>(next));
    r.state = RequestState::kRunning;
    r.num_cached_tokens = kv_.NumCachedTokens(id);
    r.num_computed_tokens = kv_.ReplayStart(id);
    auto pos = std::find_if(running_.begin(), running_.end(),
                            [&](RequestId x) { return Before(r, requests_.at(x)); });
    running_.insert(pos, id);
    add_chunk(r, start + n - r.num_computed_tokens);
  }
  return plan;
}

void Scheduler::ResolveSamples(const StepPlan& plan, std::span<const int32_t> sampled) {
  size_t next = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.sample) continue;
    const int32_t token = next < sampled.size() ? sampled[next] : kPlaceholderToken;
    ++next;
    auto it = requests_.find(c.id);
    if (it == requests_.end() || it->second.state == RequestState::kFinished) continue;
    // The placeholder sits right after the chunk, also when the request was preempted since.
    std::vector<int32_t>& tokens = it->second.tokens;
    const auto pos = static_cast<size_t>(c.start_pos + c.num_tokens);
    if (pos < tokens.size() && tokens[pos] == kPlaceholderToken) tokens[pos] = token;
  }
}

void Scheduler::SetDraft(RequestId id, std::vector<int32_t> draft) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.state != RequestState::kRunning) return;
  it->second.draft = std::move(draft);
}

void Scheduler::ResolveDraft(const ScheduledChunk& c, std::span<const int32_t> extra,
                             int64_t num_computed) {
  auto it = requests_.find(c.id);
  if (it == requests_.end() || it->second.state != RequestState::kRunning) return;
  SchedRequest& r = it->second;
  // Only while the step's token is the last one (the request was not preempted since).
  if (r.num_tokens() != c.start_pos + c.num_tokens + 1 || r.has_placeholder()) return;
  r.tokens.insert(r.tokens.end(), extra.begin(), extra.end());
  r.num_computed_tokens = std::min(num_computed, r.num_tokens() - 1);
}

void Scheduler::OnStepDone(const StepPlan& plan) {
  for (const ScheduledChunk& c : plan.chunks) {
    auto it = requests_.find(c.id);
    if (it == requests_.end() || it->second.state != RequestState::kRunning) continue;
    SchedRequest& r = it->second;
    // Blocks are published only up to the tokens whose values are known.
    int64_t known = r.num_computed_tokens;
    while (known > 0 && r.tokens[static_cast<size_t>(known - 1)] == kPlaceholderToken) --known;
    kv_.CommitComputed(r.id, r.tokens, known);
    r.num_done_tokens = known;
    kv_.ReleaseOutsideWindow(r.id, r.num_computed_tokens);
    if (r.num_generated() >= r.max_new_tokens && !r.has_placeholder()) {
      Finish(r.id, FinishReason::kLength);
    }
  }
}

void Scheduler::Finish(RequestId id, FinishReason reason, std::string error) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.state == RequestState::kFinished) return;
  SchedRequest& r = it->second;
  kv_.Free(id);
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  r.state = RequestState::kFinished;
  r.finish = reason;
  r.error = std::move(error);
}

void Scheduler::Release(RequestId id) {
  auto it = requests_.find(id);
  if (it != requests_.end() && it->second.state == RequestState::kFinished) requests_.erase(it);
}

}  // namespace dinfer::sched
