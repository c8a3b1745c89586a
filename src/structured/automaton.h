// Automaton: a grammar compiled into one deterministic automaton per rule, over bytes, whose
// transitions either consume a byte or call another rule (a recursive transition network, i.e. a
// pushdown automaton whose stack holds return states). Character classes are lowered to UTF-8 or
// JSON string escapes, each rule is determinized, trimmed of states that cannot finish and
// minimized; all states are then numbered globally. Left recursion is rejected (the runtime is
// top-down). Immutable after Build; safe to read from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "structured/grammar.h"

namespace dinfer::structured {

// Transition words: -1 when the byte is not allowed, else the target state with mark bits.
inline constexpr int32_t kTargetMask = (1 << 29) - 1;
inline constexpr int32_t kIncBit = 1 << 29;    // completes one character of a counted rule
inline constexpr int32_t kCloseBit = 1 << 30;  // leaves the counted part of a counted rule
inline constexpr uint32_t kInfiniteCount = 0x7FFFFFFF;

struct AutomatonLimits {
  int64_t max_nfa_states = 4'000'000;
  int64_t max_dfa_states = 1'000'000;
};

class Automaton {
 public:
  struct Call {
    int32_t rule;
    int32_t ret;  // state of the caller to continue in once the callee finishes
  };
  struct State {
    int32_t rule = 0;
    int32_t trans_base = -1;  // into trans_ (one entry per byte class); -1: consumes no byte
    int32_t class_base = 0;   // into byte_class_ (256 entries for the rule)
    int32_t call_begin = 0, call_end = 0;
    bool final = false;
    // Counted rules: fewest and most characters still needed before the closing transition
    // (kInfiniteCount when unbounded); 0 for states past it and for uncounted rules.
    uint32_t need_min = 0, need_max = 0;
    // Fewest bytes from this state to the end of its rule (calls cost their rule's min_bytes).
    uint32_t to_end = 0;
  };
  struct RuleInfo {
    std::string name;
    int32_t start = 0;
    int32_t first_state = 0, end_state = 0;
    bool counted = false;
    uint32_t min_count = 0, max_count = kUnbounded;
    bool nullable = false;
    uint32_t min_bytes = 0;  // the shortest text the rule matches
  };

  static StatusOr<Automaton> Build(const Grammar& grammar, const AutomatonLimits& limits = {});

  int32_t Next(int32_t state, uint8_t byte) const {
    const State& s = states_[state];
    if (s.trans_base < 0) return -1;
    return trans_[s.trans_base + byte_class_[s.class_base + byte]];
  }
  const State& state(int32_t id) const { return states_[id]; }
  const RuleInfo& rule(int32_t id) const { return rules_[id]; }
  const Call* calls_begin(int32_t s) const { return calls_.data() + states_[s].call_begin; }
  const Call* calls_end(int32_t s) const { return calls_.data() + states_[s].call_end; }
  int32_t num_states() const { return static_cast<int32_t>(states_.size()); }
  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }
  int32_t root() const { return root_; }
  int64_t num_transitions() const;

  // Whether a counted rule may move to `target` with its count then being `count`.
  bool CountAllows(int32_t target, uint32_t count) const {
    const State& t = states_[target];
    const RuleInfo& r = rules_[t.rule];
    return static_cast<uint64_t>(count) + t.need_min <= r.max_count &&
           (t.need_max == kInfiniteCount ||
            static_cast<uint64_t>(count) + t.need_max >= r.min_count);
  }

 private:
  std::vector<State> states_;
  std::vector<RuleInfo> rules_;
  std::vector<Call> calls_;
  std::vector<int32_t> trans_;
  std::vector<uint8_t> byte_class_;
  int32_t root_ = 0;

  friend class AutomatonBuilder;
};

}  // namespace dinfer::structured
