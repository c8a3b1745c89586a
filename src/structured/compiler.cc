#include "structured/compiler.h"

#include <chrono>
#include <cstring>

namespace dinfer::structured {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The rule's states in breadth-first order from its start (bytes in order, then calls): the same
// automaton reached from different grammars numbers its states the same way.
std::vector<int32_t> CanonicalOrder(const Automaton& a, int32_t rule) {
  const Automaton::RuleInfo& r = a.rule(rule);
  std::vector<uint8_t> seen(r.end_state - r.first_state, 0);
  std::vector<int32_t> order = {r.start};
  seen[r.start - r.first_state] = 1;
  auto visit = [&](int32_t t) {
    if (!seen[t - r.first_state]) {
      seen[t - r.first_state] = 1;
      order.push_back(t);
    }
  };
  for (size_t i = 0; i < order.size(); ++i) {
    const int32_t s = order[i];
    for (int b = 0; b < 256; ++b) {
      const int32_t w = a.Next(s, static_cast<uint8_t>(b));
      if (w >= 0) visit(w & kTargetMask);
    }
    for (const Automaton::Call* c = a.calls_begin(s); c != a.calls_end(s); ++c) visit(c->ret);
  }
  for (int32_t s = r.first_state; s < r.end_state; ++s) visit(s);
  return order;
}

void AppendInt(std::string* out, uint32_t v) {
  char buf[4];
  std::memcpy(buf, &v, 4);
  out->append(buf, 4);
}

// Identifies a rule that calls no other rule by its automaton alone.
std::string LeafSignature(const Automaton& a, int32_t rule, const std::vector<int32_t>& order) {
  const Automaton::RuleInfo& r = a.rule(rule);
  std::vector<uint32_t> index(r.end_state - r.first_state);
  for (size_t i = 0; i < order.size(); ++i)
    index[order[i] - r.first_state] = static_cast<uint32_t>(i);
  std::string sig;
  AppendInt(&sig, r.counted);
  AppendInt(&sig, static_cast<uint32_t>(order.size()));
  for (int32_t s : order) {
    const Automaton::State& st = a.state(s);
    AppendInt(&sig, st.final);
    AppendInt(&sig, st.need_min);
    AppendInt(&sig, st.need_max);
    int32_t prev = -2;
    for (int b = 0; b < 256; ++b) {
      const int32_t w = a.Next(s, static_cast<uint8_t>(b));
      const int32_t key = w < 0 ? -1
                                : static_cast<int32_t>(index[(w & kTargetMask) - r.first_state]) |
                                      (w & ~kTargetMask);
      if (key != prev) {
        AppendInt(&sig, static_cast<uint32_t>(b));
        AppendInt(&sig, static_cast<uint32_t>(key));
        prev = key;
      }
    }
  }
  return sig;
}

std::shared_ptr<RuleMasks> ComputeRuleMasks(const Automaton& a, const std::vector<int32_t>& order,
                                            const TokenIndex& tokens) {
  auto masks = std::make_shared<RuleMasks>();
  masks->states.resize(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    if (a.state(order[i]).trans_base >= 0) {
      masks->states[i] = ComputeStateMasks(a, order[i], tokens);
    }
  }
  return masks;
}

}  // namespace

size_t RuleMasks::MemoryBytes() const {
  size_t bytes = 0;
  for (const StateMasks& s : states) bytes += s.MemoryBytes();
  return bytes;
}

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenIndex> tokens,
                                 size_t shared_cache_bytes)
    : tokens_(std::move(tokens)), cache_budget_(shared_cache_bytes) {}

std::shared_ptr<const RuleMasks> GrammarCompiler::SharedRuleMasks(const Automaton& a, int32_t rule,
                                                                  const std::vector<int32_t>& order,
                                                                  bool* from_cache) const {
  std::string sig = LeafSignature(a, rule, order);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(sig); it != cache_.end()) {
      lru_.splice(lru_.end(), lru_, it->second.pos);
      *from_cache = true;
      return it->second.masks;
    }
  }
  *from_cache = false;
  std::shared_ptr<const RuleMasks> masks = ComputeRuleMasks(a, order, *tokens_);
  const size_t bytes = masks->MemoryBytes() + sig.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = cache_.find(sig); it != cache_.end()) return it->second.masks;
  if (bytes > cache_budget_) return masks;
  lru_.push_back(sig);
  cache_.emplace(std::move(sig), CacheEntry{masks, std::prev(lru_.end()), bytes});
  cache_bytes_ += bytes;
  while (cache_bytes_ > cache_budget_ && !lru_.empty()) {
    auto it = cache_.find(lru_.front());
    cache_bytes_ -= it->second.bytes;
    cache_.erase(it);
    lru_.pop_front();
  }
  return masks;
}

StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::Compile(
    const Grammar& grammar) const {
  const auto t0 = std::chrono::steady_clock::now();
  DINFER_ASSIGN_OR_RETURN(Automaton automaton, Automaton::Build(grammar));
  auto cg = std::shared_ptr<CompiledGrammar>(new CompiledGrammar());
  cg->automaton_ = std::move(automaton);
  cg->tokens_ = tokens_;
  const Automaton& a = cg->automaton_;
  GrammarStats& stats = cg->stats_;
  stats.rules = a.num_rules();
  stats.states = a.num_states();
  stats.transitions = a.num_transitions();
  stats.build_ms = MsSince(t0);

  const auto t1 = std::chrono::steady_clock::now();
  cg->first_bytes_.assign(a.num_states(), ByteSet256{});
  for (int32_t s = 0; s < a.num_states(); ++s) {
    if (a.state(s).trans_base < 0) continue;
    for (int b = 0; b < 256; ++b) {
      if (a.Next(s, static_cast<uint8_t>(b)) >= 0) cg->first_bytes_[s][b >> 6] |= 1ull << (b & 63);
    }
  }
  cg->state_masks_.assign(a.num_states(), nullptr);
  for (int32_t r = 0; r < a.num_rules(); ++r) {
    const std::vector<int32_t> order = CanonicalOrder(a, r);
    bool leaf = true;
    for (int32_t s : order) leaf &= a.state(s).call_begin == a.state(s).call_end;
    std::shared_ptr<const RuleMasks> masks;
    if (leaf) {
      bool from_cache = false;
      masks = SharedRuleMasks(a, r, order, &from_cache);
      stats.shared_mask_rules += from_cache;
      if (!from_cache) stats.mask_bytes += masks->MemoryBytes();
    } else {
      masks = ComputeRuleMasks(a, order, *tokens_);
      stats.mask_bytes += masks->MemoryBytes();
    }
    for (size_t i = 0; i < order.size(); ++i) {
      cg->state_masks_[order[i]] = &masks->states[i];
      stats.mask_states += a.state(order[i]).trans_base >= 0;
    }
    cg->rule_masks_.push_back(std::move(masks));
  }
  stats.mask_ms = MsSince(t1);
  return std::shared_ptr<const CompiledGrammar>(std::move(cg));
}

}  // namespace dinfer::structured
