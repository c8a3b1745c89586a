#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "base/thread_pool.h"
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

// Where the next search starts, and whether the previous match ended right there (an empty match
// there is then skipped, as Oniguruma's iterator does). A search's result depends on nothing
// else: the whole subject stays visible, so lookarounds see the same text from any state.
struct ScanState {
  size_t start = 0;
  bool after_match = false;
  bool operator==(const ScanState&) const = default;
};

// One search from `s`: appends the match found, if any, and returns the state after it; a start
// past the subject's end means the scan is over.
ScanState NextMatch(pcre2_code* code, std::string_view subject, ScanState s,
                    std::vector<Regex::Match>* out) {
  thread_local MatchResources resources;
  const ScanState done{subject.size() + 1, false};
  pcre2_match_data* data = resources.data();
  if (data == nullptr) return done;
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(),
                             s.start, 0, data, resources.context());
  // rc == 0: the match data has no room for the groups, but the whole match is there.
  if (rc < 0) return done;  // no match (or a resource limit: the rest stays unsplit)
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  const size_t begin = ovector[0], end = ovector[1];
  if (begin == end && begin == s.start && s.after_match) {
    // Oniguruma's iterator: no empty match right after the previous match; step one char.
    if (s.start >= subject.size()) return done;
    return {s.start + DecodeUtf8(subject, s.start).length, false};
  }
  out->push_back({begin, end});
  return {end, true};
}

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
  for (ScanState s; s.start <= subject.size();) s = NextMatch(Code(code_), subject, s, out);
}

// The subject is cut into chunks, each scanned at once from a fresh state at its start, until it
// passes the next cut. The scan of chunk 0 is exact. Then, chunk by chunk, the exact scan's
// state at the cut is looked up among the states chunk k's scan went through: from a common state
// two scans find the same matches, so chunk k's matches from there on are exact. Until they meet
// (a cut inside a match), the exact scan steps on by itself; typically they meet within a word.
void Regex::FindAllParallel(std::string_view subject, ThreadPool& pool,
                            std::vector<Match>* out) const {
  constexpr size_t kMinChunkBytes = 32 << 10;
  const size_t n = subject.size();
  const size_t chunks =
      std::min<size_t>(static_cast<size_t>(pool.num_threads()) * 4, n / kMinChunkBytes);
  if (pool.num_threads() < 2 || chunks < 2) {
    FindAll(subject, out);
    return;
  }
  std::vector<size_t> cuts(chunks + 1);
  for (size_t k = 1; k < chunks; ++k) {
    size_t c = n * k / chunks;
    while (c < n && (static_cast<unsigned char>(subject[c]) & 0xC0) == 0x80) ++c;  // whole chars
    cuts[k] = c;
  }
  cuts[chunks] = n + 1;
  struct Scan {
    std::vector<Match> matches;
    std::vector<std::pair<ScanState, size_t>> states;  // each state and the matches before it
    ScanState end;
  };
  std::vector<Scan> scans(chunks);
  pool.ParallelFor(static_cast<int64_t>(chunks), [&](int, int64_t task) {
    const size_t k = static_cast<size_t>(task);
    Scan& scan = scans[k];
    ScanState s{cuts[k], false};
    while (s.start <= n && s.start < cuts[k + 1]) {
      scan.states.emplace_back(s, scan.matches.size());
      s = NextMatch(Code(code_), subject, s, &scan.matches);
    }
    scan.end = s;
  });

  *out = std::move(scans[0].matches);
  ScanState s = scans[0].end;
  for (size_t k = 1; k < chunks && s.start <= n; ++k) {
    const auto& states = scans[k].states;
    while (s.start <= n) {
      auto it = std::lower_bound(states.begin(), states.end(), s.start,
                                 [](const auto& e, size_t start) { return e.first.start < start; });
      for (; it != states.end() && it->first.start == s.start && !(it->first == s); ++it) {
      }
      if (it != states.end() && it->first == s) {
        out->insert(out->end(), scans[k].matches.begin() + static_cast<ptrdiff_t>(it->second),
                    scans[k].matches.end());
        s = scans[k].end;
        break;
      }
      if (s.start >= cuts[k + 1]) break;  // past chunk k without meeting its scan
      s = NextMatch(Code(code_), subject, s, out);
    }
  }
  while (s.start <= n) s = NextMatch(Code(code_), subject, s, out);
}

}  // namespace dinfer::tokenizer
