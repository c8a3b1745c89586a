#include "structured/automaton.h"

#include <algorithm>
#include <array>
#include <functional>
#include <queue>
#include <unordered_map>
#include <utility>

#include "structured/rule_dfa.h"

namespace dinfer::structured {
namespace {

constexpr size_t kMinimizeLimit = 20000;

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
      DINFER_ASSIGN_OR_RETURN(
          dfas[r], BuildRuleDfa(g_, r, limits_.max_nfa_states, limits_.max_dfa_states - total));
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
    ComputeDistances(&a);
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

  // Shortest completions: each rule's shortest text and each state's fewest bytes to its rule's
  // end, where a call costs its rule's shortest text; to a fixpoint over the calls.
  static void ComputeDistances(Automaton* a) {
    const int32_t nr = a->num_rules();
    // Edges reversed: (from, weight in bytes or -1 - callee for a call).
    std::vector<std::vector<std::pair<int32_t, int32_t>>> rev(a->num_states());
    std::vector<std::vector<int32_t>> callers(nr);
    for (int32_t s = 0; s < a->num_states(); ++s) {
      for (int b = 0; b < 256; ++b) {
        const int32_t w = a->Next(s, static_cast<uint8_t>(b));
        if (w >= 0) rev[w & kTargetMask].emplace_back(s, 1);
      }
      for (const Automaton::Call* c = a->calls_begin(s); c != a->calls_end(s); ++c) {
        rev[c->ret].emplace_back(s, -1 - c->rule);
        callers[c->rule].push_back(a->states_[s].rule);
      }
    }
    for (auto& rs : a->rules_) rs.min_bytes = kInfiniteCount;
    for (auto& st : a->states_) st.to_end = kInfiniteCount;
    std::vector<uint8_t> queued(nr, 1);
    std::vector<int32_t> work(nr);
    for (int32_t r = 0; r < nr; ++r) work[r] = r;
    using Item = std::pair<uint64_t, int32_t>;
    while (!work.empty()) {
      const int32_t r = work.back();
      work.pop_back();
      queued[r] = 0;
      Automaton::RuleInfo& info = a->rules_[r];
      std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
      for (int32_t s = info.first_state; s < info.end_state; ++s) {
        a->states_[s].to_end = a->states_[s].final ? 0 : kInfiniteCount;
        if (a->states_[s].final) heap.emplace(0, s);
      }
      while (!heap.empty()) {
        const auto [d, s] = heap.top();
        heap.pop();
        if (d > a->states_[s].to_end) continue;
        for (const auto& [p, w] : rev[s]) {
          const uint64_t cost = w > 0 ? 1 : a->rules_[-1 - w].min_bytes;
          if (cost >= kInfiniteCount) continue;
          const uint64_t nd = d + cost;
          if (nd < a->states_[p].to_end) {
            a->states_[p].to_end =
                static_cast<uint32_t>(std::min<uint64_t>(nd, kInfiniteCount - 1));
            heap.emplace(nd, p);
          }
        }
      }
      const uint32_t shortest = a->states_[info.start].to_end;
      if (shortest != info.min_bytes) {
        info.min_bytes = shortest;
        for (int32_t c : callers[r]) {
          if (!queued[c]) {
            queued[c] = 1;
            work.push_back(c);
          }
        }
      }
    }
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
