// Precomputed token masks of one automaton state (the context-independent part of a mask).
// For a stack whose top is in state s of rule R, each token either
//  - is consumed entirely inside R (with the rules R calls) from s: "inside", allowed whatever the
//    stack below R holds (for counted rules: allowed when R's count stays within its bounds);
//  - finishes R after a prefix of its bytes: a "pop", allowed when the rest (its suffix) is
//    accepted by the stack below R, which is known only at run time (checked by walking a trie of
//    the suffixes), or at once when the token ends exactly where R finishes;
//  - or is rejected whatever the context.
// Computing this walks the vocabulary trie once per state. Immutable after construction.
#pragma once

#include <cstdint>
#include <vector>

#include "structured/automaton.h"
#include "structured/token_index.h"

namespace dinfer::structured {

// A set of token ids: a bitset when dense, a sorted list when sparse.
struct TokenSet {
  std::vector<uint32_t> bits;
  std::vector<int32_t> ids;
  int32_t count = 0;
  void OrInto(uint32_t* mask) const;
  size_t MemoryBytes() const { return bits.size() * 4 + ids.size() * 4; }
};

// Pops whose token continues after the rule finished, keyed by the suffix bytes.
struct SuffixTrie {
  struct Node {
    uint8_t byte = 0;
    uint16_t depth = 0;
    int32_t subtree_end = 0;
    int32_t entry_begin = 0, entry_end = 0;  // into tokens / counts
  };
  std::vector<Node> nodes;  // preorder; node 0 is the root (the empty suffix)
  std::vector<int32_t> tokens;
  std::vector<uint32_t> counts;  // characters counted before the rule finished (counted rules)
  bool empty() const { return tokens.empty(); }
};

struct StateMasks {
  TokenSet inside;
  // Counted rules: the inside tokens with the count they need: a token is allowed at count k when
  // k + hi <= max and k + lo >= min (lo = kInfiniteCount: no lower constraint). Sorted by hi.
  struct Counted {
    int32_t token;
    uint32_t hi, lo;
  };
  std::vector<Counted> counted;
  // The counted tokens with a finite lo, as (lo, token) sorted by lo.
  std::vector<std::pair<uint32_t, int32_t>> finite_lo;
  // Tokens that end exactly where the rule finishes, with the count at that point.
  std::vector<std::pair<int32_t, uint32_t>> pop_end;
  SuffixTrie suffixes;
  size_t MemoryBytes() const;
};

// Computes the masks of `state` (a state that consumes bytes) by walking the vocabulary trie with
// a stack whose bottom is the state's rule.
StateMasks ComputeStateMasks(const Automaton& automaton, int32_t state, const TokenIndex& tokens);

// The same masks, derived from those of `ref_state` (a state of the same rule that calls no other
// rule): only the vocabulary subtrees whose first byte the two states treat differently are
// walked. Much cheaper when the states share most transitions (a string's states all loop back).
StateMasks DeriveStateMasks(const Automaton& automaton, int32_t state, const TokenIndex& tokens,
                            int32_t ref_state, const StateMasks& ref);

}  // namespace dinfer::structured
