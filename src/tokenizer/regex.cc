#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/unicode.h"

namespace dinfer::tokenizer {
namespace {

// Oniguruma's \s is Unicode White_Space; PCRE2's (with UCP) also takes U+180E and misses nothing
// else that matters, so \s is spelled out.
constexpr std::string_view kSpaceSet =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
constexpr std::string_view kHexSet = "0-9a-fA-F";  // Oniguruma's \h (PCRE2's is blank space)

pcre2_code* Code(void* code) { return static_cast<pcre2_code*>(code); }

// Per-thread match context with a JIT stack larger than the default 32 KiB.
class MatchResources {
 public:
  MatchResources()
      : context_(pcre2_match_context_create(nullptr)),
        stack_(pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr)),
        data_(pcre2_match_data_create(1, nullptr)) {
    if (context_ && stack_) pcre2_jit_stack_assign(context_, nullptr, stack_);
  }
  ~MatchResources() {
    pcre2_match_data_free(data_);
    pcre2_jit_stack_free(stack_);
    pcre2_match_context_free(context_);
  }
  pcre2_match_context* context() const { return context_; }
  // Room for the whole match only: capture groups are never read.
  pcre2_match_data* data() const { return data_; }

 private:
  pcre2_match_context* context_;
  pcre2_jit_stack* stack_;
  pcre2_match_data* data_;
};

}  // namespace

std::string TranslateOnigurumaPattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[++i];
      const std::string_view set = d == 's' || d == 'S' ? kSpaceSet : kHexSet;
      if (d == 's' || d == 'h') {
        if (!in_class) out += '[';
        out += set;
        if (!in_class) out += ']';
      } else if ((d == 'S' || d == 'H') && !in_class) {
        out += "[^";
        out += set;
        out += ']';
      } else {
        out += c;
        out += d;
      }
      continue;
    }
    out += c;
    if (in_class) {
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
        const size_t close = p.find(":]", i + 2);
        if (close != std::string_view::npos) {
          out.append(p.substr(i + 1, close + 1 - i));
          i = close + 1;
        }
      } else if (c == ']') {
        in_class = false;
      }
    } else if (c == '[') {
      in_class = true;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is literal
    }
  }
  return out;
}

StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  const std::string translated = TranslateOnigurumaPattern(pattern);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_MULTILINE, &error,
                    &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return InvalidArgument("cannot compile regex '{}': {} (at offset {} of '{}')", pattern,
                           reinterpret_cast<const char*>(message), error_offset, translated);
  }
  // Without JIT (an unsupported CPU), pcre2_match falls back to the interpreter.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  std::unique_ptr<Regex> regex(new Regex());
  regex->pattern_ = std::string(pattern);
  regex->code_ = code;
  return regex;
}

Regex::~Regex() { pcre2_code_free(Code(code_)); }

void Regex::FindAll(std::string_view subject, std::vector<Match>* out) const {
  out->clear();
  thread_local MatchResources resources;
  pcre2_match_data* data = resources.data();
  if (data == nullptr) return;
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (start <= subject.size()) {
    const int rc =
        pcre2_match(Code(code_), text, subject.size(), start, 0, data, resources.context());
    // rc == 0: the match data has no room for the groups, but the whole match is there.
    if (rc < 0) break;  // no match (or a resource limit: the rest stays unsplit)
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0], end = ovector[1];
    if (begin == end && have_last && last_end == end) {
      // Oniguruma's iterator: no empty match right after the previous match; step one char.
      if (start >= subject.size()) break;
      start += DecodeUtf8(subject, start).length;
      continue;
    }
    out->push_back({begin, end});
    start = end;
    have_last = true;
    last_end = end;
  }
}

}  // namespace dinfer::tokenizer
