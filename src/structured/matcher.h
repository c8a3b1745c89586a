// Matcher: one request's position in a compiled grammar. It accepts tokens (or raw bytes), fills
// the bitmask of the tokens allowed next, rolls back accepted tokens (speculative decoding), and
// finds text the grammar forces next (jump-forward). The mask of a step is the union, over the
// stacks alive in the current configuration, of the precomputed masks of their top states plus
// the tokens that finish the top rule and continue correctly below it (checked by walking a small
// trie of suffixes with the real stack). Stop tokens are allowed exactly where the text is a
// complete match. A Matcher belongs to one request: not thread-safe; many matchers may share one
// CompiledGrammar across threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "structured/compiler.h"
#include "structured/pda.h"

namespace dinfer::structured {

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Accepts one token; false (and no change) when the grammar does not allow it. A stop token is
  // allowed where the text is complete and terminates the matcher.
  bool AcceptToken(int32_t token);
  // Accepts raw bytes as one step (all of them or none).
  bool AcceptBytes(std::string_view bytes);
  // Writes BitmaskWords(vocab_size) words: bit i set when token i may come next.
  void FillNextTokenBitmask(uint32_t* bitmask);
  // The same, for a request that may generate at most `remaining_tokens` more tokens (this one
  // included): once the budget comes within kFinishWindow tokens of the shortest completion,
  // only single-byte tokens after which a completion still fits the budget (one byte a token,
  // then a stop token) are allowed, and a stop token where the text is complete, so that the
  // text ends complete instead of cut off; as the budget runs out, only the shortest completion
  // is left. Where no such token exists the plain mask is kept.
  void FillNextTokenBitmask(uint32_t* bitmask, int64_t remaining_tokens);
  static constexpr int64_t kFinishWindow = 16;
  // Fewest bytes that complete the text from here (0 when it is complete).
  uint64_t CompletionBytes() const { return Distance(history_.back().cfg); }
  // Undoes the last `steps` AcceptToken/AcceptBytes calls; false if fewer were made.
  bool Rollback(int32_t steps);
  void Reset();

  // The text so far is a complete match: a stop token may come next.
  bool IsCompleted() const { return !history_.back().terminated && history_.back().cfg.complete; }
  // A stop token was accepted, or the text is complete and nothing else may follow.
  bool IsTerminated() const {
    return history_.back().terminated || history_.back().cfg.tops.empty();
  }
  // The longest text the grammar allows next and nothing else (up to max_bytes; it stops where
  // the text could also end). The matcher is unchanged.
  std::string FindJumpForwardString(size_t max_bytes = 256);

  int32_t num_steps() const { return static_cast<int32_t>(history_.size()) - 1; }
  int32_t vocab_size() const { return grammar_->tokens().vocab_size(); }
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  struct Entry {
    Config cfg;
    size_t pool_mark = 0;
    bool terminated = false;
  };

  bool StepBytes(const Config& from, std::string_view bytes, Config* out);
  uint64_t Distance(const Config& cfg) const;
  void AddInside(const StateMasks& m, const Automaton::RuleInfo& rule, uint32_t count,
                 uint32_t* mask);
  void WalkSuffixes(const SuffixTrie& trie, const Config& start, const Automaton::RuleInfo& rule,
                    uint32_t count, uint32_t* mask);
  bool CountOk(const Automaton::RuleInfo& rule, uint64_t count) const {
    return !rule.counted || (count >= rule.min_count && count <= rule.max_count);
  }

  std::shared_ptr<const CompiledGrammar> grammar_;
  const Automaton& a_;
  Pda pda_;
  FramePool pool_;
  std::vector<Entry> history_;
  // Scratch reused across calls.
  std::vector<Config> walk_;
  Config tmp_, tmp2_;
  std::vector<uint32_t> scratch_;
};

}  // namespace dinfer::structured
