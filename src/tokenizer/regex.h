// Regex: a PCRE2 (JIT) pattern with the semantics of the Oniguruma regexes HF `tokenizers` runs
// its pre-tokenizer patterns with (\s is Unicode White_Space, \h a hex digit, ^/$ match at line
// ends, empty matches right after a match are skipped). Ill-formed UTF-8 in the subject never
// matches and never breaks matching. Immutable after Compile; ForEachMatch is safe from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dinfer {
class ThreadPool;
}

namespace dinfer::tokenizer {

// Rewrites an Oniguruma (Ruby syntax) pattern into the PCRE2 pattern that matches the same text.
std::string TranslateOnigurumaPattern(std::string_view pattern);

class Regex {
 public:
  struct Match {
    size_t begin, end;  // byte offsets into the subject
  };

  // `pattern` is in Oniguruma syntax, as tokenizer.json files hold them.
  static StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Leftmost-first, non-overlapping matches of the whole subject, in order; replaces *out.
  void FindAll(std::string_view subject, std::vector<Match>* out) const;
  // The same matches, searched for on `pool` (for long subjects; shorter ones take FindAll).
  void FindAllParallel(std::string_view subject, ThreadPool& pool, std::vector<Match>* out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8
};

}  // namespace dinfer::tokenizer
