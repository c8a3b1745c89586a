#include "structured/compiler.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

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

// Identifies the part of a rule that calls nothing reachable from `start` (in breadth-first
// order) by its automaton alone; nullopt when that part has more than `limit` states.
std::optional<std::string> Signature(const Automaton& a, int32_t start, size_t limit) {
  const Automaton::RuleInfo& r = a.rule(a.state(start).rule);
  std::vector<int32_t> index(r.end_state - r.first_state, -1);
  std::vector<int32_t> order = {start};
  index[start - r.first_state] = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    for (int b = 0; b < 256; ++b) {
      const int32_t w = a.Next(order[i], static_cast<uint8_t>(b));
      if (w < 0) continue;
      const int32_t t = w & kTargetMask;
      if (index[t - r.first_state] < 0) {
        if (order.size() == limit) return std::nullopt;
        index[t - r.first_state] = static_cast<int32_t>(order.size());
        order.push_back(t);
      }
    }
  }
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
      const int32_t key =
          w < 0 ? -1 : index[(w & kTargetMask) - r.first_state] | (w & ~kTargetMask);
      if (key != prev) {
        AppendInt(&sig, static_cast<uint32_t>(b));
        AppendInt(&sig, static_cast<uint32_t>(key));
        prev = key;
      }
    }
  }
  return sig;
}

// Tokens per first byte: the cost of walking that subtree of the vocabulary.
std::array<int64_t, 256> FirstByteTokens(const TokenIndex& tokens) {
  std::array<int64_t, 256> n{};
  for (int32_t child : tokens.root_children()) {
    const TokenIndex::Node& node = tokens.nodes()[child];
    n[node.byte] = node.sub_tok_end - node.tok_begin;
  }
  return n;
}

// Compile-time mask work per rule, in tokens visited (about 2 ms): rules beyond it (long chains
// of distinct states, such as bounded repetitions) leave their remaining states to run time.
constexpr int64_t kEagerBudget = 400'000;
// The busiest state of a rule is also cached on its own when it reaches few states: the loop of
// a string body is the same in every key-exclusion or pattern rule that ends in one.
constexpr size_t kStateSignatureLimit = 64;

}  // namespace

const StateMasks& CompiledGrammar::ComputeLazy(int32_t state) const {
  std::lock_guard<std::mutex> lock(lazy_mu_);
  if (const StateMasks* m = masks_[state].load(std::memory_order_acquire)) return *m;
  lazy_.push_back(ComputeStateMasks(automaton_, state, *tokens_));
  masks_[state].store(&lazy_.back(), std::memory_order_release);
  return lazy_.back();
}

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenIndex> tokens,
                                 size_t shared_cache_bytes)
    : tokens_(std::move(tokens)), cache_budget_(shared_cache_bytes) {}

std::shared_ptr<const void> GrammarCompiler::CacheGet(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  if (it == cache_.end()) return nullptr;
  lru_.splice(lru_.end(), lru_, it->second.pos);
  return it->second.value;
}

void GrammarCompiler::CachePut(std::string key, std::shared_ptr<const void> value,
                               size_t bytes) const {
  bytes += key.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > cache_budget_ || cache_.contains(key)) return;
  lru_.push_back(key);
  cache_.emplace(std::move(key), CacheEntry{std::move(value), std::prev(lru_.end()), bytes});
  cache_bytes_ += bytes;
  while (cache_bytes_ > cache_budget_ && !lru_.empty()) {
    auto it = cache_.find(lru_.front());
    cache_bytes_ -= it->second.bytes;
    cache_.erase(it);
    lru_.pop_front();
  }
}

std::shared_ptr<const GrammarCompiler::MaskList> GrammarCompiler::LeafRuleMasks(
    const Automaton& a, const std::vector<int32_t>& order, bool* from_cache) const {
  const std::string key = "rule:" + *Signature(a, order[0], SIZE_MAX);
  if (auto hit = CacheGet(key)) {
    *from_cache = true;
    return std::static_pointer_cast<const MaskList>(hit);
  }
  *from_cache = false;
  // States of a rule that calls nothing often share most transitions (every state of a string
  // loops back to its body): a state's masks are derived from a computed successor when only a
  // small part of the vocabulary goes different ways. The busiest states come first.
  const TokenIndex& tokens = *tokens_;
  const std::array<int64_t, 256> weight = FirstByteTokens(tokens);
  const int32_t first = a.rule(a.state(order[0]).rule).first_state;
  std::vector<size_t> slot(order.size());
  for (size_t i = 0; i < order.size(); ++i) slot[order[i] - first] = i;
  std::vector<int64_t> popularity(order.size(), 0);
  for (int32_t s : order) {
    for (int b = 0; b < 256; ++b) {
      const int32_t w = a.Next(s, static_cast<uint8_t>(b));
      if (w >= 0) popularity[slot[(w & kTargetMask) - first]] += weight[b];
    }
  }
  std::vector<size_t> by_popularity(order.size());
  for (size_t i = 0; i < order.size(); ++i) by_popularity[i] = i;
  std::stable_sort(by_popularity.begin(), by_popularity.end(),
                   [&](size_t x, size_t y) { return popularity[x] > popularity[y]; });
  auto list = std::make_shared<MaskList>(order.size());
  int64_t spent = 0;
  bool complete = true;
  for (size_t i : by_popularity) {
    const int32_t s = order[i];
    if (a.state(s).trans_base < 0) continue;
    int64_t fresh = 0;
    std::vector<int32_t> targets;
    for (int b = 0; b < 256; ++b) {
      const int32_t w = a.Next(s, static_cast<uint8_t>(b));
      if (w < 0) continue;
      fresh += weight[b];
      const int32_t t = w & kTargetMask;
      if (std::find(targets.begin(), targets.end(), t) == targets.end()) targets.push_back(t);
    }
    size_t best = order.size();
    int64_t best_cost = fresh / 4;
    for (int32_t t : targets) {
      const size_t j = slot[t - first];
      if (!(*list)[j] || t == s) continue;
      int64_t cost = 0;
      for (int b = 0; b < 256; ++b) {
        const int32_t w = a.Next(s, static_cast<uint8_t>(b));
        if (w >= 0 && w != a.Next(t, static_cast<uint8_t>(b))) cost += weight[b];
      }
      if (cost < best_cost) {
        best_cost = cost;
        best = j;
      }
    }
    if (best < order.size()) {
      (*list)[i] =
          std::make_shared<StateMasks>(DeriveStateMasks(a, s, tokens, order[best], *(*list)[best]));
      spent += best_cost;
      continue;
    }
    std::optional<std::string> state_key;
    if (i == by_popularity[0]) state_key = Signature(a, s, kStateSignatureLimit);
    if (state_key) {
      if (auto hit = CacheGet("state:" + *state_key)) {
        (*list)[i] = std::static_pointer_cast<const StateMasks>(hit);
        continue;
      }
    }
    if (spent + fresh > kEagerBudget && spent > 0) {
      complete = false;  // left to run time
      continue;
    }
    auto masks = std::make_shared<const StateMasks>(ComputeStateMasks(a, s, tokens));
    spent += fresh;
    if (state_key) CachePut("state:" + *state_key, masks, masks->MemoryBytes());
    (*list)[i] = std::move(masks);
  }
  if (complete) {
    size_t bytes = 0;
    for (const auto& m : *list) bytes += m ? m->MemoryBytes() : 0;
    CachePut(key, list, bytes);
  }
  return list;
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
  cg->masks_ = std::make_unique<std::atomic<const StateMasks*>[]>(a.num_states());
  for (int32_t s = 0; s < a.num_states(); ++s) {
    cg->masks_[s].store(nullptr, std::memory_order_relaxed);
    if (a.state(s).trans_base < 0) continue;
    ++stats.mask_states;
    for (int b = 0; b < 256; ++b) {
      if (a.Next(s, static_cast<uint8_t>(b)) >= 0) cg->first_bytes_[s][b >> 6] |= 1ull << (b & 63);
    }
  }
  for (int32_t r = 0; r < a.num_rules(); ++r) {
    const std::vector<int32_t> order = CanonicalOrder(a, r);
    bool leaf = true;
    for (int32_t s : order) leaf &= a.state(s).call_begin == a.state(s).call_end;
    if (!leaf) continue;  // masked on first use
    bool from_cache = false;
    std::shared_ptr<const MaskList> masks = LeafRuleMasks(a, order, &from_cache);
    stats.shared_mask_rules += from_cache;
    for (size_t i = 0; i < order.size(); ++i) {
      const std::shared_ptr<const StateMasks>& m = (*masks)[i];
      if (!m) continue;
      cg->masks_[order[i]].store(m.get(), std::memory_order_relaxed);
      cg->eager_.push_back(m);
      ++stats.eager_states;
      if (!from_cache) stats.mask_bytes += m->MemoryBytes();
    }
  }
  stats.mask_ms = MsSince(t1);
  return std::shared_ptr<const CompiledGrammar>(std::move(cg));
}

}  // namespace dinfer::structured
