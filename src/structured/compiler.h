// GrammarCompiler turns a Grammar into a CompiledGrammar for one tokenizer: the automaton plus the
// token masks of its states. Masks of rules that call no other rule (strings, patterns, formats,
// whitespace, EBNF terminals) do not depend on the grammar around them: they are computed when the
// grammar is compiled and cached per tokenizer by the rule's automaton (and the busiest state of a
// rule by its own reachable automaton), so the common ones (a JSON string) are computed once per
// tokenizer, as llguidance's tokenizer "slices" are. States of rules that call others (objects,
// arrays) are cheap to mask and many are never visited: their masks are computed the first time a
// matcher needs them, then kept. A GrammarCompiler is thread-safe (Compile may run on many threads
// at once); a CompiledGrammar is shared by the matchers of all requests that use it, from any
// thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
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

using ByteSet256 = std::array<uint64_t, 4>;
inline bool ByteIn(const ByteSet256& set, uint8_t b) { return (set[b >> 6] >> (b & 63)) & 1u; }

struct GrammarStats {
  int32_t rules = 0;
  int32_t states = 0;
  int64_t transitions = 0;
  int32_t mask_states = 0;        // states that consume bytes (each gets masks)
  int32_t eager_states = 0;       // of which computed (or found cached) at compile time
  int32_t shared_mask_rules = 0;  // rules whose masks came from the tokenizer-wide cache
  size_t mask_bytes = 0;          // memory of the masks this grammar computed at compile time
  double build_ms = 0;            // grammar to automaton
  double mask_ms = 0;             // mask precomputation
};

class CompiledGrammar {
 public:
  const Automaton& automaton() const { return automaton_; }
  const TokenIndex& tokens() const { return *tokens_; }
  const std::shared_ptr<const TokenIndex>& token_index() const { return tokens_; }
  // The masks of a state that consumes bytes; computed on first use for lazy states.
  const StateMasks& masks(int32_t state) const {
    const StateMasks* m = masks_[state].load(std::memory_order_acquire);
    return m ? *m : ComputeLazy(state);
  }
  const ByteSet256& first_bytes(int32_t state) const { return first_bytes_[state]; }
  const GrammarStats& stats() const { return stats_; }

 private:
  friend class GrammarCompiler;
  CompiledGrammar() = default;
  const StateMasks& ComputeLazy(int32_t state) const;

  Automaton automaton_;
  std::shared_ptr<const TokenIndex> tokens_;
  std::vector<std::shared_ptr<const StateMasks>> eager_;
  std::unique_ptr<std::atomic<const StateMasks*>[]> masks_;
  std::vector<ByteSet256> first_bytes_;
  mutable std::mutex lazy_mu_;
  mutable std::deque<StateMasks> lazy_;
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
  using MaskList = std::vector<std::shared_ptr<const StateMasks>>;
  // The masks of a rule that calls nothing, by its canonical state order.
  std::shared_ptr<const MaskList> LeafRuleMasks(const Automaton& a,
                                                const std::vector<int32_t>& order,
                                                bool* from_cache) const;
  std::shared_ptr<const void> CacheGet(const std::string& key) const;
  void CachePut(std::string key, std::shared_ptr<const void> value, size_t bytes) const;

  std::shared_ptr<const TokenIndex> tokens_;
  size_t cache_budget_;
  mutable std::mutex mu_;
  // Least recently used first.
  mutable std::list<std::string> lru_;
  struct CacheEntry {
    std::shared_ptr<const void> value;
    std::list<std::string>::iterator pos;
    size_t bytes;
  };
  mutable std::unordered_map<std::string, CacheEntry> cache_;
  mutable size_t cache_bytes_ = 0;
};

}  // namespace dinfer::structured
