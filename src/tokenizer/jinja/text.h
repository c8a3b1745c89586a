// Text: a UTF-8 string that remembers, byte range by byte range, whether the template wrote it
// (trusted) or it came from the data the template was rendered with (untrusted). Every string
// operation of the Jinja interpreter keeps this provenance, so a rendered prompt can be cut into
// trusted and untrusted segments. Also the Python str helpers the interpreter shares (code
// points, whitespace, case mapping). Value type; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dinfer::tokenizer::jinja {

class Text {
 public:
  struct Run {
    size_t end = 0;  // the run covers bytes [previous run's end, end)
    bool trusted = false;
  };

  Text() = default;
  Text(std::string s, bool trusted);

  const std::string& str() const { return str_; }
  size_t size() const { return str_.size(); }
  bool empty() const { return str_.empty(); }
  const std::vector<Run>& runs() const { return runs_; }
  bool AllTrusted() const;

  void Append(const Text& t);
  void Append(std::string_view s, bool trusted);
  // Bytes [begin, end) with their provenance.
  Text Slice(size_t begin, size_t end) const;
  // Each code point replaced by map(code point, previous code point) (0 before the first), the
  // replacement keeping the provenance of the code point it replaces: case mapping.
  Text MapCodePoints(char32_t (*map)(char32_t c, char32_t previous)) const;

 private:
  std::string str_;
  std::vector<Run> runs_;
};

// Python str helpers over UTF-8 (code points are what Python's len, indices and slices count).
size_t CodePointCount(std::string_view s);
// Byte offset of every code point, plus s.size() at the end.
std::vector<size_t> CodePointOffsets(std::string_view s);
// str.isspace() for one code point.
bool IsPySpace(char32_t c);
// The code point at `pos` and its length in bytes (ill-formed bytes count as one code point each).
char32_t CodePointAt(std::string_view s, size_t pos, size_t* length);
// Simple case mapping (one code point to one): ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic.
char32_t ToUpper(char32_t c);
char32_t ToLower(char32_t c);
bool IsAlpha(char32_t c);
bool IsDigit(char32_t c);

// Byte ranges [begin, end) of Python str.strip(chars): chars empty means whitespace.
void StripRange(std::string_view s, std::string_view chars, bool left, bool right, size_t* begin,
                size_t* end);

}  // namespace dinfer::tokenizer::jinja
