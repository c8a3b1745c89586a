// Scanning pieces for the output parsers: a scanner that finds where a JSON value written by a
// model ends, one character at a time (so its text can stream as it arrives), JSON string
// escaping and unescaping, and partial-marker matching. Value types; one per stream, not
// thread-safe; the free functions are pure.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dinfer::output {

// Feed a JSON value's characters one at a time. Containers and strings are tracked exactly;
// the contents are only checked for balance, since the parsers stream them as written.
class JsonValueScanner {
 public:
  enum class Step {
    kTaken,  // the character belongs to the value
    kEnded,  // the value ended before this character (which is not part of it)
    kError,  // the character cannot start or continue a value
  };
  Step Feed(char c);
  // A value was started and has ended (a closed container or string; a scalar ends only at the
  // next character or at the end of the output, see scalar_pending()).
  bool complete() const { return complete_; }
  bool scalar_pending() const { return scalar_; }
  bool is_string() const { return kind_ == '"'; }  // the value is a JSON string
  void Reset() { *this = JsonValueScanner(); }

 private:
  std::vector<char> stack_;  // open containers: '{' or '['
  char kind_ = 0;            // first character of the value
  bool in_string_ = false, escape_ = false;
  bool scalar_ = false;  // inside a top-level number or literal
  bool complete_ = false;
};

bool IsJsonSpace(char c);

// The length of the longest suffix of `text` that is a proper prefix of `literal`: how much of
// the text to hold back because it may be the start of `literal`.
size_t PartialSuffix(std::string_view text, std::string_view literal);

// Decodes the inside of a JSON string as it streams: Push returns the text decoded so far,
// holding back an escape sequence that is not complete yet. Invalid escapes pass through as
// written; unpaired surrogates become U+FFFD.
class JsonStringDecoder {
 public:
  std::string Push(std::string_view raw);
  std::string Finish();  // whatever is held, as written

 private:
  std::string pending_;
  unsigned high_surrogate_ = 0;
};

}  // namespace dinfer::output
