#include "structured/rule_dfa.h"

#include <algorithm>
#include <unordered_map>

#include "structured/lowering.h"

namespace dinfer::structured {
namespace {

struct PairHash {
  size_t operator()(const std::pair<int32_t, int32_t>& p) const {
    return static_cast<size_t>((static_cast<uint64_t>(static_cast<uint32_t>(p.first)) << 32 |
                                static_cast<uint32_t>(p.second)) *
                                   0x9E3779B97F4A7C15ull >>
                               7);
  }
};

// Interns sequences of ints (state sets, signatures) in flat storage: ids are dense, in order of
// first appearance.
class SeqInterner {
 public:
  SeqInterner() : table_(1024, -1) { start_.push_back(0); }

  int32_t Intern(const int32_t* seq, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (size_t i = 0; i < n; ++i) {
      h = (h ^ static_cast<uint32_t>(seq[i])) * 0x100000001B3ull;
      h ^= h >> 29;
    }
    const size_t mask = table_.size() - 1;
    size_t slot = h & mask;
    while (table_[slot] >= 0) {
      const int32_t id = table_[slot];
      if (hash_[id] == h && start_[id + 1] - start_[id] == n &&
          std::equal(seq, seq + n, data_.begin() + start_[id])) {
        return id;
      }
      slot = (slot + 1) & mask;
    }
    const auto id = static_cast<int32_t>(hash_.size());
    data_.insert(data_.end(), seq, seq + n);
    start_.push_back(data_.size());
    hash_.push_back(h);
    table_[slot] = id;
    if (hash_.size() * 2 > table_.size()) Rehash();
    return id;
  }
  size_t size() const { return hash_.size(); }
  // Copies sequence `id` (the storage may move while more are interned).
  void Get(int32_t id, std::vector<int32_t>* out) const {
    out->assign(data_.begin() + start_[id], data_.begin() + start_[id + 1]);
  }

 private:
  void Rehash() {
    table_.assign(table_.size() * 2, -1);
    const size_t mask = table_.size() - 1;
    for (size_t id = 0; id < hash_.size(); ++id) {
      size_t slot = hash_[id] & mask;
      while (table_[slot] >= 0) slot = (slot + 1) & mask;
      table_[slot] = static_cast<int32_t>(id);
    }
  }
  std::vector<int32_t> data_;
  std::vector<size_t> start_;
  std::vector<uint64_t> hash_;
  std::vector<int32_t> table_;
};

// Thompson construction, right to left: Build(e, next) returns the entry of a fragment that
// matches e and then continues in `next`. Memoizing on (e, next) keeps shared subexpressions
// with the same continuation shared, which keeps objects with many optional properties linear.
class NfaBuilder {
 public:
  NfaBuilder(const Grammar& g, bool counted, int64_t limit)
      : g_(g), counted_(counted), limit_(limit) {}

  int32_t New() {
    nfa_.states.emplace_back();
    if (static_cast<int64_t>(nfa_.states.size()) > limit_) overflow_ = true;
    return static_cast<int32_t>(nfa_.states.size() - 1);
  }

  int32_t Build(ExprId id, int32_t next) {
    if (overflow_) return next;
    const auto key = std::make_pair(id, next);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    const int32_t entry = BuildUncached(id, next);
    memo_.emplace(key, entry);
    return entry;
  }

  Nfa& nfa() { return nfa_; }
  bool overflow() const { return overflow_; }

 private:
  int32_t BuildUncached(ExprId id, int32_t next) {
    const Expr& e = g_.expr(id);
    switch (e.kind) {
      case Expr::Kind::kEmpty:
        return next;
      case Expr::Kind::kNothing:
        return New();
      case Expr::Kind::kBytes: {
        const int32_t s = New();
        const uint8_t mark = counted_ ? static_cast<uint8_t>(e.mark) : 0;
        for (const auto& [lo, hi] : e.ranges) {
          nfa_.states[s].bytes.push_back(
              {static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), mark, next});
        }
        return s;
      }
      case Expr::Kind::kChars: {
        const int32_t s = New();
        LowerChars(e.ranges, e.encoding, counted_, s, next, &nfa_);
        if (static_cast<int64_t>(nfa_.states.size()) > limit_) overflow_ = true;
        return s;
      }
      case Expr::Kind::kSeq: {
        int32_t cur = next;
        for (size_t i = e.kids.size(); i-- > 0;) cur = Build(e.kids[i], cur);
        return cur;
      }
      case Expr::Kind::kAlt: {
        const int32_t s = New();
        for (ExprId kid : e.kids) {
          const int32_t entry = Build(kid, next);
          nfa_.states[s].eps.push_back(entry);
        }
        return s;
      }
      case Expr::Kind::kRepeat: {
        const ExprId kid = e.kids[0];
        int32_t cur;
        if (e.max == kUnbounded) {
          cur = New();
          if (e.absorbing) nfa_.absorbing.push_back(cur);
          nfa_.states[cur].eps.push_back(next);
          const int32_t body = BuildUncached(kid, cur);
          nfa_.states[cur].eps.push_back(body);
        } else {
          cur = next;
          for (uint32_t i = e.min; i < e.max && !overflow_; ++i) {
            const int32_t s = New();
            nfa_.states[s].eps.push_back(next);
            const int32_t body = BuildUncached(kid, cur);
            nfa_.states[s].eps.push_back(body);
            cur = s;
          }
        }
        for (uint32_t i = 0; i < e.min && !overflow_; ++i) cur = BuildUncached(kid, cur);
        return cur;
      }
      case Expr::Kind::kRule: {
        const int32_t s = New();
        nfa_.states[s].calls.emplace_back(e.rule, next);
        return s;
      }
      case Expr::Kind::kDfa: {
        const int32_t base = static_cast<int32_t>(nfa_.states.size());
        for (size_t i = 0; i < e.dfa->states.size(); ++i) New();
        for (size_t i = 0; i < e.dfa->states.size(); ++i) {
          const ByteDfa::State& st = e.dfa->states[i];
          NfaState& ns = nfa_.states[base + i];
          for (const ByteDfa::Edge& edge : st.edges) {
            ns.bytes.push_back({edge.lo, edge.hi, 0, base + edge.to});
          }
          if (st.final) ns.eps.push_back(next);
        }
        return base;
      }
    }
    return next;
  }

  const Grammar& g_;
  bool counted_;
  int64_t limit_;
  bool overflow_ = false;
  Nfa nfa_;
  std::unordered_map<std::pair<int32_t, int32_t>, int32_t, PairHash> memo_;
};

// Subset construction.
StatusOr<Dfa> Determinize(const Nfa& nfa, int32_t start, int32_t final, int64_t limit,
                          const std::string& rule_name) {
  std::vector<uint32_t> stamp(nfa.states.size(), 0);
  std::vector<uint8_t> absorbing(nfa.states.size(), 0);
  for (int32_t s : nfa.absorbing) absorbing[s] = 1;
  uint32_t epoch = 0;
  std::vector<int32_t> stack, closed;
  SeqInterner sets;
  // Interns the epsilon closure of `seeds`; a set holding an absorbing loop is just that loop.
  auto closure = [&](std::vector<int32_t>& seeds) {
    for (int32_t s : seeds) {
      if (absorbing[s]) {
        seeds.assign(1, s);
        break;
      }
    }
    ++epoch;
    closed.clear();
    stack.swap(seeds);
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      if (stamp[s] == epoch) continue;
      stamp[s] = epoch;
      closed.push_back(s);
      if (absorbing[s] && closed.size() > 1) {
        // Reached through epsilons: restart from the loop alone.
        stack.assign(1, s);
        closed.clear();
        ++epoch;
        continue;
      }
      for (int32_t t : nfa.states[s].eps) {
        if (stamp[t] != epoch) stack.push_back(t);
      }
    }
    std::sort(closed.begin(), closed.end());
    return sets.Intern(closed.data(), closed.size());
  };

  Dfa dfa;
  std::vector<int32_t> seeds = {start}, members, targets;
  dfa.start = closure(seeds);
  std::vector<const ByteEdge*> edges;
  std::vector<int> bounds;
  std::vector<std::pair<int32_t, int32_t>> calls;
  for (size_t d = 0; d < sets.size(); ++d) {
    if (static_cast<int64_t>(sets.size()) > limit) {
      return InvalidArgument("rule '{}' is too complex: over {} automaton states", rule_name,
                             limit);
    }
    sets.Get(static_cast<int32_t>(d), &members);
    DState st;
    edges.clear();
    bounds.clear();
    calls.clear();
    for (int32_t s : members) {
      if (s == final) st.final = true;
      for (const ByteEdge& e : nfa.states[s].bytes) {
        edges.push_back(&e);
        bounds.push_back(e.lo);
        bounds.push_back(e.hi + 1);
      }
      calls.insert(calls.end(), nfa.states[s].calls.begin(), nfa.states[s].calls.end());
    }
    std::sort(bounds.begin(), bounds.end());
    bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
      const int lo = bounds[i], hi = bounds[i + 1] - 1;
      targets.clear();
      uint8_t mark = 0;
      bool unmarked = false;
      for (const ByteEdge* e : edges) {
        if (e->lo <= lo && hi <= e->hi) {
          targets.push_back(e->to);
          mark |= e->mark;
          unmarked |= e->mark == 0;
        }
      }
      if (targets.empty()) continue;
      if (mark != 0 && unmarked) {
        return Internal("rule '{}': ambiguous character counting", rule_name);
      }
      const int32_t to = closure(targets);
      if (!st.segs.empty() && st.segs.back().hi + 1 == lo && st.segs.back().to == to &&
          st.segs.back().mark == mark) {
        st.segs.back().hi = static_cast<uint8_t>(hi);
      } else {
        st.segs.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), mark, to});
      }
    }
    std::sort(calls.begin(), calls.end());
    for (size_t i = 0; i < calls.size();) {
      size_t j = i;
      targets.clear();
      while (j < calls.size() && calls[j].first == calls[i].first)
        targets.push_back(calls[j++].second);
      st.calls.emplace_back(calls[i].first, closure(targets));
      i = j;
    }
    dfa.states.push_back(std::move(st));
  }
  return dfa;
}

}  // namespace

StatusOr<Dfa> BuildRuleDfa(const Grammar& grammar, RuleId rule, int64_t max_nfa_states,
                           int64_t max_dfa_states) {
  const Rule& r = grammar.rule(rule);
  NfaBuilder nb(grammar, r.counted, max_nfa_states);
  const int32_t final = nb.New();
  const int32_t start = nb.Build(r.body, final);
  if (nb.overflow()) {
    return InvalidArgument("rule '{}' is too large: over {} automaton states", r.name,
                           max_nfa_states);
  }
  return Determinize(nb.nfa(), start, final, max_dfa_states, r.name);
}

}  // namespace dinfer::structured
