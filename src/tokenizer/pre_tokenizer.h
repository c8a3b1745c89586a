// PreTokenizer: splits normalized text into the pieces ("words") BPE merges within, following HF
// `tokenizers`' pre-tokenizers: Split (regex or literal; every delimiter behavior; invert), Digits,
// and ByteLevel (optional prefix space and GPT-2 regex), applied in sequence.
// Immutable after Create; Split is safe from any thread (each caller passes its own scratch).
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tokenizer/regex.h"

namespace dinfer {
class ThreadPool;
}

namespace dinfer::tokenizer {

// What happens to a match (the "delimiter") when a piece is split, as HF names it.
enum class SplitBehavior {
  kRemoved,             // dropped
  kIsolated,            // a piece of its own
  kMergedWithPrevious,  // appended to the piece before it
  kMergedWithNext,      // prepended to the piece after it
  kContiguous,          // consecutive matches form one piece
};

// GPT-2's pattern, which HF's ByteLevel pre-tokenizer uses when use_regex is set.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct PreTokenizerStep {
  enum class Kind { kSplit, kDigits, kByteLevel };
  Kind kind = Kind::kSplit;
  // kSplit
  std::string pattern;
  bool pattern_is_regex = true;  // false: a literal string
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;  // the non-matching parts act as the delimiters
  // kDigits
  bool individual_digits = false;
  // kByteLevel (must be the last step: later steps would see byte-level chars)
  bool add_prefix_space = false;
  bool use_regex = true;

  static PreTokenizerStep SplitRegex(std::string pattern,
                                     SplitBehavior behavior = SplitBehavior::kIsolated);
  static PreTokenizerStep Digits(bool individual_digits);
  static PreTokenizerStep ByteLevel(bool add_prefix_space, bool use_regex);
};

class PreTokenizer {
 public:
  // Reusable buffers of one caller.
  struct Scratch {
    std::string prefixed;  // pieces with a prefix space added
    std::vector<std::string_view> next;
    std::vector<Regex::Match> matches;
    std::vector<std::pair<std::string_view, bool>> parts;
  };

  static StatusOr<std::unique_ptr<PreTokenizer>> Create(std::vector<PreTokenizerStep> steps);

  // Replaces *pieces with the non-empty pieces of `text`; they view `text` or scratch->prefixed.
  void Split(std::string_view text, Scratch* scratch, std::vector<std::string_view>* pieces) const;

  // The same pieces for a long text, computed on `pool` (one scratch per pool thread): the first
  // step's regex searched in parallel (Regex::FindAllParallel), the later steps, which split each
  // piece on its own, run on chunks of pieces at once. Pieces view `text` or strings added to
  // *copies (whose elements never move).
  void SplitParallel(std::string_view text, ThreadPool& pool, std::span<Scratch> scratch,
                     std::vector<std::string_view>* pieces, std::deque<std::string>* copies) const;

  // True when a ByteLevel step maps bytes to GPT-2's alphabet before the model sees them.
  bool byte_level() const { return byte_level_; }

 private:
  struct CompiledStep {
    PreTokenizerStep step;
    std::unique_ptr<Regex> regex;  // null for literal patterns and ByteLevel without regex
  };
  PreTokenizer() = default;
  // Applies steps [first, end) to *pieces.
  void ApplySteps(size_t first, Scratch* scratch, std::vector<std::string_view>* pieces) const;
  // Appends the pieces `step` cuts `piece` into to scratch->next; `matches` (when given) are the
  // step's regex matches in `piece`, already found.
  void SplitPiece(std::string_view piece, const CompiledStep& step, Scratch* scratch,
                  const std::vector<Regex::Match>* matches = nullptr) const;

  std::vector<CompiledStep> steps_;
  bool byte_level_ = false;
};

}  // namespace dinfer::tokenizer
