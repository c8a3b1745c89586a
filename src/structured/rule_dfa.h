// One rule's deterministic automaton on its way into an Automaton: the NFA built from the
// rule's expression (Thompson construction, characters lowered to bytes), its subset
// construction, and its minimization. Internal to the automaton builder; plain functions.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "structured/grammar.h"

namespace dinfer::structured {

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

// The rule's expression as a DFA (calls stay as call transitions); InvalidArgument when it needs
// more states than the limits allow.
StatusOr<Dfa> BuildRuleDfa(const Grammar& grammar, RuleId rule, int64_t max_nfa_states,
                           int64_t max_dfa_states);

// Computes the rule's byte classes and, with `refine`, merges equivalent states.
Dfa Minimize(const Dfa& dfa, std::array<uint8_t, 256>* classes, int* num_classes, bool refine);

}  // namespace dinfer::structured
