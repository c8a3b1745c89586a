// GrammarCompiler turns a Grammar into a CompiledGrammar for one tokenizer: the automaton plus the
// precomputed masks of every state that consumes bytes. Rules that call no other rule (strings,
// patterns, formats, EBNF terminals) have masks that do not depend on the grammar around them;
// they are cached per tokenizer by the rule's automaton, so the common ones (a JSON string) are
// computed once per tokenizer, not once per grammar, as llguidance's tokenizer "slices" are.
// A GrammarCompiler is thread-safe (Compile may run on many threads at once); a CompiledGrammar is
// immutable and shared by the matchers of all requests that use it.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "structured/automaton.h"
#include "structured/grammar.h"
#include "structured/masks.h"
#include "structured/token_index.h"

namespace dinfer::structured {

// Masks of one rule's states, by the rule's canonical state order.
struct RuleMasks {
  std::vector<StateMasks> states;
  size_t MemoryBytes() const;
};

using ByteSet256 = std::array<uint64_t, 4>;
inline bool ByteIn(const ByteSet256& set, uint8_t b) { return (set[b >> 6] >> (b & 63)) & 1u; }

struct GrammarStats {
  int32_t rules = 0;
  int32_t states = 0;
  int64_t transitions = 0;
  int32_t mask_states = 0;        // states with precomputed masks
  int32_t shared_mask_rules = 0;  // rules whose masks came from the tokenizer-wide cache
  size_t mask_bytes = 0;          // memory of the masks this grammar computed itself
  double build_ms = 0;            // grammar to automaton
  double mask_ms = 0;             // mask precomputation
};

class CompiledGrammar {
 public:
  const Automaton& automaton() const { return automaton_; }
  const TokenIndex& tokens() const { return *tokens_; }
  const std::shared_ptr<const TokenIndex>& token_index() const { return tokens_; }
  const StateMasks& masks(int32_t state) const { return *state_masks_[state]; }
  const ByteSet256& first_bytes(int32_t state) const { return first_bytes_[state]; }
  const GrammarStats& stats() const { return stats_; }

 private:
  friend class GrammarCompiler;
  Automaton automaton_;
  std::shared_ptr<const TokenIndex> tokens_;
  std::vector<std::shared_ptr<const RuleMasks>> rule_masks_;
  std::vector<const StateMasks*> state_masks_;
  std::vector<ByteSet256> first_bytes_;
  GrammarStats stats_;
};

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const TokenIndex> tokens,
                           size_t shared_cache_bytes = size_t{512} << 20);

  StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const Grammar& grammar) const;

  const TokenIndex& tokens() const { return *tokens_; }
  const std::shared_ptr<const TokenIndex>& token_index() const { return tokens_; }

 private:
  std::shared_ptr<const RuleMasks> SharedRuleMasks(const Automaton& a, int32_t rule,
                                                   const std::vector<int32_t>& order,
                                                   bool* from_cache) const;

  std::shared_ptr<const TokenIndex> tokens_;
  size_t cache_budget_;
  mutable std::mutex mu_;
  // Least recently used first.
  mutable std::list<std::string> lru_;
  struct CacheEntry {
    std::shared_ptr<const RuleMasks> masks;
    std::list<std::string>::iterator pos;
    size_t bytes;
  };
  mutable std::unordered_map<std::string, CacheEntry> cache_;
  mutable size_t cache_bytes_ = 0;
};

}  // namespace dinfer::structured
