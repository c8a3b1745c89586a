#include "structured/automaton.h"

#include <algorithm>
#include <array>
#include <tuple>
#include <unordered_map>
#include <utility>

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

// One rule's deterministic automaton before global numbering.
struct Segment {
  uint8_t lo, hi, mark;
  int32_t to;
};
struct DState {
  std::vector<Segment> segs;
  std::vector<std::pair<int32_t, int32_t>> calls;  // (rule, target), sorted by rule
  bool final = false;
  uint32_t need_min = 0, need_max = 0;
};
struct Dfa {
  std::vector<DState> states;
  int32_t start = 0;
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

// Keeps the states reachable from the start that can reach a final state; calls only into
// `productive` rules. Returns false when the start state itself cannot finish.
bool Trim(Dfa* dfa, const std::vector<uint8_t>& productive) {
  const int32_t n = static_cast<int32_t>(dfa->states.size());
  for (DState& s : dfa->states) {
    std::erase_if(s.calls, [&](const auto& c) { return !productive[c.first]; });
  }
  std::vector<std::vector<int32_t>> rev(n);
  for (int32_t s = 0; s < n; ++s) {
    for (const Segment& seg : dfa->states[s].segs) rev[seg.to].push_back(s);
    for (const auto& c : dfa->states[s].calls) rev[c.second].push_back(s);
  }
  std::vector<uint8_t> live(n, 0), reach(n, 0);
  std::vector<int32_t> stack;
  for (int32_t s = 0; s < n; ++s) {
    if (dfa->states[s].final) {
      live[s] = 1;
      stack.push_back(s);
    }
  }
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t p : rev[s]) {
      if (!live[p]) {
        live[p] = 1;
        stack.push_back(p);
      }
    }
  }
  if (!live[dfa->start]) return false;
  reach[dfa->start] = 1;
  stack.push_back(dfa->start);
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    auto visit = [&](int32_t t) {
      if (live[t] && !reach[t]) {
        reach[t] = 1;
        stack.push_back(t);
      }
    };
    for (const Segment& seg : dfa->states[s].segs) visit(seg.to);
    for (const auto& c : dfa->states[s].calls) visit(c.second);
  }
  std::vector<int32_t> remap(n, -1);
  Dfa out;
  for (int32_t s = 0; s < n; ++s) {
    if (reach[s]) {
      remap[s] = static_cast<int32_t>(out.states.size());
      out.states.push_back(std::move(dfa->states[s]));
    }
  }
  for (DState& s : out.states) {
    std::erase_if(s.segs, [&](const Segment& seg) { return remap[seg.to] < 0; });
    for (Segment& seg : s.segs) seg.to = remap[seg.to];
    std::erase_if(s.calls, [&](const auto& c) { return remap[c.second] < 0; });
    for (auto& c : s.calls) c.second = remap[c.second];
  }
  out.start = remap[dfa->start];
  *dfa = std::move(out);
  return true;
}

bool CanFinish(const Dfa& dfa, const std::vector<uint8_t>& productive) {
  std::vector<uint8_t> seen(dfa.states.size(), 0);
  std::vector<int32_t> stack = {dfa.start};
  seen[dfa.start] = 1;
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    if (dfa.states[s].final) return true;
    auto visit = [&](int32_t t) {
      if (!seen[t]) {
        seen[t] = 1;
        stack.push_back(t);
      }
    };
    for (const Segment& seg : dfa.states[s].segs) visit(seg.to);
    for (const auto& [rule, to] : dfa.states[s].calls) {
      if (productive[rule]) visit(to);
    }
  }
  return false;
}

// Counted rules (no calls): the fewest and most characters between each state and the closing
// transition. States past it need nothing.
void ComputeNeeds(Dfa* dfa) {
  const int32_t n = static_cast<int32_t>(dfa->states.size());
  std::vector<std::vector<std::pair<int32_t, int>>> rev(n);  // (source, weight)
  std::vector<uint8_t> pre(n, 0);
  std::vector<int32_t> stack;
  for (int32_t s = 0; s < n; ++s) {
    for (const Segment& seg : dfa->states[s].segs) {
      if (seg.mark & static_cast<uint8_t>(ByteMark::kClose)) {
        if (!pre[s]) stack.push_back(s);
        pre[s] = 1;
      } else {
        rev[seg.to].emplace_back(s, (seg.mark & static_cast<uint8_t>(ByteMark::kChar)) ? 1 : 0);
      }
    }
  }
  // Pre-close states: those that can still reach a closing transition.
  std::vector<int32_t> sources = stack;
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (const auto& [p, w] : rev[s]) {
      if (!pre[p]) {
        pre[p] = 1;
        stack.push_back(p);
      }
    }
  }
  // need_min: 0-1 BFS backwards from the states with a closing transition.
  std::vector<uint32_t> dist(n, kInfiniteCount);
  std::vector<int32_t> front, back;
  for (int32_t s : sources) {
    dist[s] = 0;
    front.push_back(s);
  }
  while (!front.empty() || !back.empty()) {
    if (front.empty()) {
      std::swap(front, back);
      std::reverse(front.begin(), front.end());
    }
    const int32_t s = front.back();
    front.pop_back();
    for (const auto& [p, w] : rev[s]) {
      if (dist[s] + w < dist[p]) {
        dist[p] = dist[s] + w;
        (w == 0 ? front : back).push_back(p);
      }
    }
  }
  // need_max: longest path over the condensation; a cycle through a character is unbounded.
  std::vector<int32_t> index(n, -1), low(n, 0), comp(n, -1);
  std::vector<uint8_t> on_stack(n, 0);
  std::vector<int32_t> tarjan;
  std::vector<uint32_t> comp_max;
  int32_t counter = 0;
  struct Frame {
    int32_t s;
    size_t edge;
  };
  std::vector<Frame> frames;
  for (int32_t root = 0; root < n; ++root) {
    if (!pre[root] || index[root] >= 0) continue;
    frames.push_back({root, 0});
    index[root] = low[root] = counter++;
    tarjan.push_back(root);
    on_stack[root] = 1;
    while (!frames.empty()) {
      Frame& f = frames.back();
      const auto& segs = dfa->states[f.s].segs;
      if (f.edge < segs.size()) {
        const Segment& seg = segs[f.edge++];
        const int32_t t = seg.to;
        if ((seg.mark & static_cast<uint8_t>(ByteMark::kClose)) || !pre[t]) continue;
        if (index[t] < 0) {
          index[t] = low[t] = counter++;
          tarjan.push_back(t);
          on_stack[t] = 1;
          frames.push_back({t, 0});
        } else if (on_stack[t]) {
          low[f.s] = std::min(low[f.s], index[t]);
        }
        continue;
      }
      const int32_t s = f.s;
      frames.pop_back();
      if (!frames.empty()) low[frames.back().s] = std::min(low[frames.back().s], low[s]);
      if (low[s] != index[s]) continue;
      const int32_t c = static_cast<int32_t>(comp_max.size());
      std::vector<int32_t> members;
      int32_t m;
      do {
        m = tarjan.back();
        tarjan.pop_back();
        on_stack[m] = 0;
        comp[m] = c;
        members.push_back(m);
      } while (m != s);
      uint64_t best = 0;
      bool unbounded = false;
      for (int32_t x : members) {
        for (const Segment& seg : dfa->states[x].segs) {
          if ((seg.mark & static_cast<uint8_t>(ByteMark::kClose)) || !pre[seg.to]) continue;
          const uint32_t w = (seg.mark & static_cast<uint8_t>(ByteMark::kChar)) ? 1 : 0;
          if (comp[seg.to] == c) {
            unbounded |= w == 1;
          } else if (comp_max[comp[seg.to]] == kInfiniteCount) {
            unbounded = true;
          } else {
            best = std::max<uint64_t>(best, w + comp_max[comp[seg.to]]);
          }
        }
      }
      comp_max.push_back(unbounded || best >= kInfiniteCount ? kInfiniteCount
                                                             : static_cast<uint32_t>(best));
    }
  }
  for (int32_t s = 0; s < n; ++s) {
    DState& st = dfa->states[s];
    st.need_min = pre[s] ? dist[s] : 0;
    st.need_max = pre[s] ? comp_max[comp[s]] : 0;
  }
}

// A partition of 0..n-1 into sets that can be refined by marking elements (Valmari's
// refinable partition).
class RefinablePartition {
 public:
  explicit RefinablePartition(int32_t n)
      : elems_(n),
        loc_(n),
        set_(n, 0),
        first_(n + 1),
        past_(n + 1),
        marked_(n + 1, 0),
        touched_(n + 1) {
    for (int32_t i = 0; i < n; ++i) elems_[i] = loc_[i] = i;
    sets_ = n > 0 ? 1 : 0;
    first_[0] = 0;
    past_[0] = n;
  }
  int32_t sets() const { return sets_; }
  int32_t set_of(int32_t e) const { return set_[e]; }
  int32_t first(int32_t s) const { return first_[s]; }
  int32_t past(int32_t s) const { return past_[s]; }
  int32_t elem(int32_t i) const { return elems_[i]; }
  // Sets [first, past) of elements already ordered, for an initial grouping.
  void Assign(const std::vector<int32_t>& order, const std::vector<int32_t>& starts) {
    sets_ = static_cast<int32_t>(starts.size()) - 1;
    for (int32_t k = 0; k < sets_; ++k) {
      first_[k] = starts[k];
      past_[k] = starts[k + 1];
      for (int32_t i = starts[k]; i < starts[k + 1]; ++i) {
        elems_[i] = order[i];
        loc_[order[i]] = i;
        set_[order[i]] = k;
      }
    }
  }
  void Mark(int32_t e) {
    const int32_t s = set_[e];
    const int32_t i = loc_[e];
    const int32_t j = first_[s] + marked_[s];
    elems_[i] = elems_[j];
    loc_[elems_[i]] = i;
    elems_[j] = e;
    loc_[e] = j;
    if (!marked_[s]++) touched_[num_touched_++] = s;
  }
  void Split() {
    while (num_touched_) {
      const int32_t s = touched_[--num_touched_];
      const int32_t j = first_[s] + marked_[s];
      if (j == past_[s]) {
        marked_[s] = 0;
        continue;
      }
      // The smaller part becomes the new set.
      if (marked_[s] <= past_[s] - j) {
        first_[sets_] = first_[s];
        past_[sets_] = first_[s] = j;
      } else {
        past_[sets_] = past_[s];
        first_[sets_] = past_[s] = j;
      }
      for (int32_t i = first_[sets_]; i < past_[sets_]; ++i) set_[elems_[i]] = sets_;
      marked_[s] = marked_[sets_++] = 0;
    }
  }

 private:
  std::vector<int32_t> elems_, loc_, set_, first_, past_, marked_, touched_;
  int32_t sets_ = 0, num_touched_ = 0;
};

constexpr size_t kMinimizeLimit = 20000;

// Minimization by Valmari's algorithm (partition refinement over states and transitions, for
// partial automata). Byte transitions are labelled by class and mark, calls by callee.
Dfa Minimize(const Dfa& dfa, std::array<uint8_t, 256>* classes, int* num_classes, bool refine) {
  std::array<uint8_t, 257> cut{};
  cut[0] = 1;
  for (const DState& s : dfa.states) {
    for (const Segment& seg : s.segs) {
      cut[seg.lo] = 1;
      cut[seg.hi + 1] = 1;
    }
  }
  int nc = -1;
  for (int b = 0; b < 256; ++b) {
    if (cut[b]) ++nc;
    (*classes)[b] = static_cast<uint8_t>(nc);
  }
  *num_classes = nc + 1;
  if (!refine) return dfa;
  const int32_t n = static_cast<int32_t>(dfa.states.size());
  // Transitions (tail, label, head).
  std::vector<int32_t> tail, label, head;
  std::vector<int32_t> callees;
  for (int32_t s = 0; s < n; ++s) {
    for (const Segment& seg : dfa.states[s].segs) {
      for (int c = (*classes)[seg.lo]; c <= (*classes)[seg.hi]; ++c) {
        tail.push_back(s);
        label.push_back(c * 4 + seg.mark);
        head.push_back(seg.to);
      }
    }
    for (const auto& [rule, to] : dfa.states[s].calls) {
      auto it = std::find(callees.begin(), callees.end(), rule);
      if (it == callees.end()) it = callees.insert(callees.end(), rule);
      tail.push_back(s);
      label.push_back(1024 + static_cast<int32_t>(it - callees.begin()));
      head.push_back(to);
    }
  }
  const int32_t m = static_cast<int32_t>(tail.size());
  // Initial blocks: finality and the counts still needed.
  RefinablePartition blocks(n);
  {
    std::vector<int32_t> order(n);
    for (int32_t i = 0; i < n; ++i) order[i] = i;
    auto key = [&](int32_t s) {
      const DState& st = dfa.states[s];
      return std::make_tuple(st.final, st.need_min, st.need_max);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t x, int32_t y) { return key(x) < key(y); });
    std::vector<int32_t> starts = {0};
    for (int32_t i = 1; i < n; ++i) {
      if (key(order[i]) != key(order[i - 1])) starts.push_back(i);
    }
    starts.push_back(n);
    blocks.Assign(order, starts);
  }
  // Cords: transitions grouped by label.
  RefinablePartition cords(m);
  {
    std::vector<int32_t> order(m);
    for (int32_t i = 0; i < m; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t x, int32_t y) { return label[x] < label[y]; });
    std::vector<int32_t> starts = {0};
    for (int32_t i = 1; i < m; ++i) {
      if (label[order[i]] != label[order[i - 1]]) starts.push_back(i);
    }
    starts.push_back(m);
    if (m > 0) cords.Assign(order, starts);
  }
  // Incoming transitions of each state.
  std::vector<int32_t> in_first(n + 1, 0), in_list(m);
  for (int32_t t = 0; t < m; ++t) ++in_first[head[t] + 1];
  for (int32_t s = 0; s < n; ++s) in_first[s + 1] += in_first[s];
  {
    std::vector<int32_t> fill(in_first.begin(), in_first.end() - 1);
    for (int32_t t = 0; t < m; ++t) in_list[fill[head[t]]++] = t;
  }
  int32_t b = 1, c = 0;
  while (c < cords.sets()) {
    for (int32_t i = cords.first(c); i < cords.past(c); ++i) blocks.Mark(tail[cords.elem(i)]);
    blocks.Split();
    ++c;
    while (b < blocks.sets()) {
      for (int32_t i = blocks.first(b); i < blocks.past(b); ++i) {
        const int32_t s = blocks.elem(i);
        for (int32_t j = in_first[s]; j < in_first[s + 1]; ++j) cords.Mark(in_list[j]);
      }
      cords.Split();
      ++b;
    }
  }
  const int32_t num_blocks = blocks.sets();
  Dfa out;
  out.states.resize(num_blocks);
  std::vector<uint8_t> done(num_blocks, 0);
  for (int32_t s = 0; s < n; ++s) {
    const int32_t blk = blocks.set_of(s);
    if (done[blk]) continue;
    done[blk] = 1;
    DState st = dfa.states[s];
    for (Segment& seg : st.segs) seg.to = blocks.set_of(seg.to);
    for (auto& call : st.calls) call.second = blocks.set_of(call.second);
    out.states[blk] = std::move(st);
  }
  out.start = blocks.set_of(dfa.start);
  return out;
}

}  // namespace

class AutomatonBuilder {
 public:
  AutomatonBuilder(const Grammar& g, const AutomatonLimits& limits) : g_(g), limits_(limits) {}

  StatusOr<Automaton> Run() {
    const int32_t nr = g_.num_rules();
    if (g_.root() < 0 || g_.root() >= nr) return InvalidArgument("the grammar has no root rule");
    std::vector<uint8_t> reachable = ReachableRules();
    std::vector<Dfa> dfas(nr);
    int64_t total = 0;
    for (RuleId r = 0; r < nr; ++r) {
      if (!reachable[r]) continue;
      const Rule& rule = g_.rule(r);
      if (rule.body < 0) return InvalidArgument("rule '{}' is used but not defined", rule.name);
      NfaBuilder nb(g_, rule.counted, limits_.max_nfa_states);
      const int32_t final = nb.New();
      const int32_t start = nb.Build(rule.body, final);
      if (nb.overflow()) {
        return InvalidArgument("rule '{}' is too large: over {} automaton states", rule.name,
                               limits_.max_nfa_states);
      }
      DINFER_ASSIGN_OR_RETURN(
          dfas[r], Determinize(nb.nfa(), start, final, limits_.max_dfa_states - total, rule.name));
      total += static_cast<int64_t>(dfas[r].states.size());
      if (rule.counted) {
        for (const DState& s : dfas[r].states) {
          if (!s.calls.empty()) return Internal("counted rule '{}' calls a rule", rule.name);
        }
      }
    }
    // Productive rules (those that match some text), to a fixpoint. A counted rule calls no
    // rule, so whether its count bounds can be met is settled once.
    std::vector<uint8_t> productive(nr, 0), counted_ok(nr, 1);
    for (RuleId r = 0; r < nr; ++r) {
      if (!reachable[r] || !g_.rule(r).counted) continue;
      Dfa copy = dfas[r];
      if (!Trim(&copy, productive)) continue;
      ComputeNeeds(&copy);
      const DState& s = copy.states[copy.start];
      const Rule& rule = g_.rule(r);
      counted_ok[r] = s.need_min <= rule.max_count &&
                      (s.need_max == kInfiniteCount || s.need_max >= rule.min_count);
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (RuleId r = 0; r < nr; ++r) {
        if (!reachable[r] || productive[r] || !counted_ok[r]) continue;
        if (CanFinish(dfas[r], productive)) {
          productive[r] = 1;
          changed = true;
        }
      }
    }
    if (!productive[g_.root()]) return InvalidArgument("the grammar matches no text");
    std::vector<std::array<uint8_t, 256>> classes(nr);
    std::vector<int> num_classes(nr, 0);
    for (RuleId r = 0; r < nr; ++r) {
      if (!productive[r]) continue;
      Trim(&dfas[r], productive);
      if (g_.rule(r).counted) ComputeNeeds(&dfas[r]);
      // Minimizing merges equivalent states (fewer masks to compute, canonical shapes for the
      // shared cache); refinement is quadratic on long chains, so very large rules stay as built.
      dfas[r] =
          Minimize(dfas[r], &classes[r], &num_classes[r], dfas[r].states.size() <= kMinimizeLimit);
    }
    // Keep the rules the root still reaches.
    std::vector<RuleId> kept;
    std::vector<int32_t> ids(nr, -1);
    kept.push_back(g_.root());
    ids[g_.root()] = 0;
    for (size_t i = 0; i < kept.size(); ++i) {
      for (const DState& s : dfas[kept[i]].states) {
        for (const auto& c : s.calls) {
          if (ids[c.first] < 0) {
            ids[c.first] = static_cast<int32_t>(kept.size());
            kept.push_back(c.first);
          }
        }
      }
    }
    Automaton a;
    a.rules_.resize(kept.size());
    a.byte_class_.resize(kept.size() * 256);
    int32_t next_state = 0;
    for (size_t i = 0; i < kept.size(); ++i) {
      const Rule& rule = g_.rule(kept[i]);
      Automaton::RuleInfo& info = a.rules_[i];
      info.name = rule.name;
      info.first_state = next_state;
      info.start = next_state + dfas[kept[i]].start;
      next_state += static_cast<int32_t>(dfas[kept[i]].states.size());
      info.end_state = next_state;
      info.counted = rule.counted;
      info.min_count = rule.min_count;
      info.max_count = rule.max_count;
      std::copy(classes[kept[i]].begin(), classes[kept[i]].end(), a.byte_class_.begin() + i * 256);
    }
    a.states_.resize(next_state);
    for (size_t i = 0; i < kept.size(); ++i) {
      const Dfa& dfa = dfas[kept[i]];
      const int32_t base = a.rules_[i].first_state;
      const int nc = num_classes[kept[i]];
      for (size_t s = 0; s < dfa.states.size(); ++s) {
        const DState& ds = dfa.states[s];
        Automaton::State& st = a.states_[base + s];
        st.rule = static_cast<int32_t>(i);
        st.class_base = static_cast<int32_t>(i * 256);
        st.final = ds.final;
        st.need_min = ds.need_min;
        st.need_max = ds.need_max;
        if (!ds.segs.empty()) {
          st.trans_base = static_cast<int32_t>(a.trans_.size());
          a.trans_.resize(a.trans_.size() + nc, -1);
          for (const Segment& seg : ds.segs) {
            int32_t word = base + seg.to;
            if (seg.mark & static_cast<uint8_t>(ByteMark::kChar)) word |= kIncBit;
            if (seg.mark & static_cast<uint8_t>(ByteMark::kClose)) word |= kCloseBit;
            for (int c = classes[kept[i]][seg.lo]; c <= classes[kept[i]][seg.hi]; ++c) {
              a.trans_[st.trans_base + c] = word;
            }
          }
        }
        st.call_begin = static_cast<int32_t>(a.calls_.size());
        for (const auto& [rule, to] : ds.calls) {
          a.calls_.push_back({ids[rule], base + to});
        }
        st.call_end = static_cast<int32_t>(a.calls_.size());
      }
    }
    DINFER_RETURN_IF_ERROR(CheckLeftRecursion(&a));
    return a;
  }

 private:
  std::vector<uint8_t> ReachableRules() const {
    std::vector<uint8_t> seen(g_.num_rules(), 0);
    std::vector<uint8_t> expr_seen(g_.num_exprs(), 0);
    std::vector<RuleId> rules = {g_.root()};
    seen[g_.root()] = 1;
    std::vector<ExprId> stack;
    while (!rules.empty()) {
      const RuleId r = rules.back();
      rules.pop_back();
      if (g_.rule(r).body >= 0) stack.push_back(g_.rule(r).body);
      while (!stack.empty()) {
        const ExprId e = stack.back();
        stack.pop_back();
        if (expr_seen[e]) continue;
        expr_seen[e] = 1;
        const Expr& x = g_.expr(e);
        if (x.kind == Expr::Kind::kRule && !seen[x.rule]) {
          seen[x.rule] = 1;
          rules.push_back(x.rule);
        }
        stack.insert(stack.end(), x.kids.begin(), x.kids.end());
      }
    }
    return seen;
  }

  // Nullable rules, then the rules each rule can call before consuming a byte; a cycle there is
  // left recursion, which a top-down matcher cannot run.
  Status CheckLeftRecursion(Automaton* a) const {
    const int32_t nr = a->num_rules();
    auto epsilon_reach = [&](int32_t rule, auto&& on_state) {
      std::vector<int32_t> stack = {a->rules_[rule].start};
      std::vector<uint8_t> seen(a->rules_[rule].end_state - a->rules_[rule].first_state, 0);
      const int32_t base = a->rules_[rule].first_state;
      seen[stack[0] - base] = 1;
      while (!stack.empty()) {
        const int32_t s = stack.back();
        stack.pop_back();
        on_state(s);
        for (const Automaton::Call* c = a->calls_begin(s); c != a->calls_end(s); ++c) {
          if (a->rules_[c->rule].nullable && !seen[c->ret - base]) {
            seen[c->ret - base] = 1;
            stack.push_back(c->ret);
          }
        }
      }
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (int32_t r = 0; r < nr; ++r) {
        if (a->rules_[r].nullable) continue;
        bool nullable = false;
        epsilon_reach(r, [&](int32_t s) { nullable |= a->states_[s].final; });
        if (nullable) {
          a->rules_[r].nullable = true;
          changed = true;
        }
      }
    }
    std::vector<std::vector<int32_t>> first_calls(nr);
    for (int32_t r = 0; r < nr; ++r) {
      epsilon_reach(r, [&](int32_t s) {
        for (const Automaton::Call* c = a->calls_begin(s); c != a->calls_end(s); ++c) {
          first_calls[r].push_back(c->rule);
        }
      });
    }
    std::vector<uint8_t> color(nr, 0);  // 0 new, 1 on the path, 2 done
    for (int32_t root = 0; root < nr; ++root) {
      if (color[root]) continue;
      std::vector<std::pair<int32_t, size_t>> path = {{root, 0}};
      color[root] = 1;
      while (!path.empty()) {
        auto& [r, i] = path.back();
        if (i < first_calls[r].size()) {
          const int32_t t = first_calls[r][i++];
          if (color[t] == 1) {
            return InvalidArgument(
                "rule '{}' is left-recursive (it can reach itself before matching any text); "
                "rewrite it with repetition",
                a->rules_[t].name);
          }
          if (color[t] == 0) {
            color[t] = 1;
            path.emplace_back(t, 0);
          }
        } else {
          color[r] = 2;
          path.pop_back();
        }
      }
    }
    return OkStatus();
  }

  const Grammar& g_;
  AutomatonLimits limits_;
};

StatusOr<Automaton> Automaton::Build(const Grammar& grammar, const AutomatonLimits& limits) {
  return AutomatonBuilder(grammar, limits).Run();
}

int64_t Automaton::num_transitions() const {
  int64_t n = static_cast<int64_t>(calls_.size());
  for (int32_t t : trans_) n += t >= 0;
  return n;
}

}  // namespace dinfer::structured
