#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <utility>

#include "base/thread_pool.h"

namespace dinfer::tokenizer {
namespace {

using Part = std::pair<std::string_view, bool>;  // (text, is a delimiter match)

// Joins two adjacent views of the same buffer.
std::string_view Join(std::string_view a, std::string_view b) {
  return std::string_view(a.data(), static_cast<size_t>(b.data() + b.size() - a.data()));
}

}  // namespace

PreTokenizerStep PreTokenizerStep::SplitRegex(std::string pattern, SplitBehavior behavior) {
  PreTokenizerStep s;
  s.kind = Kind::kSplit;
  s.pattern = std::move(pattern);
  s.behavior = behavior;
  return s;
}

PreTokenizerStep PreTokenizerStep::Digits(bool individual_digits) {
  PreTokenizerStep s;
  s.kind = Kind::kDigits;
  s.individual_digits = individual_digits;
  return s;
}

PreTokenizerStep PreTokenizerStep::ByteLevel(bool add_prefix_space, bool use_regex) {
  PreTokenizerStep s;
  s.kind = Kind::kByteLevel;
  s.add_prefix_space = add_prefix_space;
  s.use_regex = use_regex;
  return s;
}

StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::vector<PreTokenizerStep> steps) {
  std::unique_ptr<PreTokenizer> pre(new PreTokenizer());
  for (size_t i = 0; i < steps.size(); ++i) {
    CompiledStep compiled{std::move(steps[i]), nullptr};
    const PreTokenizerStep& step = compiled.step;
    std::string_view pattern;
    switch (step.kind) {
      case PreTokenizerStep::Kind::kSplit:
        if (step.pattern_is_regex) pattern = step.pattern;
        break;
      case PreTokenizerStep::Kind::kDigits:
        pattern = R"(\p{N})";
        break;
      case PreTokenizerStep::Kind::kByteLevel:
        if (i + 1 != steps.size()) {
          return Unimplemented("a ByteLevel pre-tokenizer must be the last one of a Sequence");
        }
        if (step.use_regex) pattern = kGpt2Pattern;
        pre->byte_level_ = true;
        break;
    }
    if (!pattern.empty()) {
      DINFER_ASSIGN_OR_RETURN(compiled.regex, Regex::Compile(pattern));
    }
    pre->steps_.push_back(std::move(compiled));
  }
  return pre;
}

void PreTokenizer::Split(std::string_view text, Scratch* scratch,
                         std::vector<std::string_view>* pieces) const {
  pieces->clear();
  if (text.empty()) return;
  pieces->push_back(text);
  ApplySteps(0, scratch, pieces);
}

void PreTokenizer::ApplySteps(size_t first, Scratch* scratch,
                              std::vector<std::string_view>* pieces) const {
  for (size_t i = first; i < steps_.size(); ++i) {
    const CompiledStep& compiled = steps_[i];
    const PreTokenizerStep& step = compiled.step;
    if (step.kind == PreTokenizerStep::Kind::kByteLevel && step.add_prefix_space) {
      // HF prepends the space to every piece that does not start with one.
      size_t size = 0;
      for (std::string_view p : *pieces) size += p.size() + 1;
      scratch->prefixed.clear();
      scratch->prefixed.reserve(size);  // no reallocation below: the views stay valid
      for (std::string_view& p : *pieces) {
        const size_t begin = scratch->prefixed.size();
        if (p.front() != ' ') scratch->prefixed.push_back(' ');
        scratch->prefixed.append(p);
        p = std::string_view(scratch->prefixed).substr(begin);
      }
    }
    if (step.kind == PreTokenizerStep::Kind::kByteLevel && !step.use_regex) continue;
    scratch->next.clear();
    for (std::string_view p : *pieces) SplitPiece(p, compiled, scratch);
    std::swap(*pieces, scratch->next);
  }
}

void PreTokenizer::SplitParallel(std::string_view text, ThreadPool& pool,
                                 std::span<Scratch> scratch, std::vector<std::string_view>* pieces,
                                 std::deque<std::string>* copies) const {
  pieces->clear();
  if (text.empty()) return;
  if (steps_.empty()) {
    pieces->push_back(text);
    return;
  }
  const CompiledStep& first = steps_[0];
  std::string_view subject = text;
  if (first.step.kind == PreTokenizerStep::Kind::kByteLevel) {
    // As first step, ByteLevel's piece is the whole text (and it is also the last step).
    if (first.step.add_prefix_space && subject.front() != ' ') {
      subject = copies->emplace_back(" " + std::string(text));
    }
    if (!first.step.use_regex) {
      pieces->push_back(subject);
      return;
    }
  }
  Scratch& s0 = scratch[0];
  s0.next.clear();
  if (first.regex) {
    std::vector<Regex::Match> matches;
    first.regex->FindAllParallel(subject, pool, &matches);
    SplitPiece(subject, first, &s0, &matches);
  } else {
    SplitPiece(subject, first, &s0);
  }
  std::vector<std::string_view> level = std::move(s0.next);
  s0.next.clear();
  if (steps_.size() == 1) {
    *pieces = std::move(level);
    return;
  }

  // The later steps, on chunks of the first step's pieces.
  constexpr size_t kChunkBytes = 32 << 10;
  std::vector<size_t> starts = {0};
  size_t bytes = 0;
  for (size_t i = 0; i < level.size(); ++i) {
    bytes += level[i].size();
    if (bytes >= kChunkBytes && i + 1 < level.size()) {
      starts.push_back(i + 1);
      bytes = 0;
    }
  }
  std::vector<std::vector<std::string_view>> outputs(starts.size());
  std::mutex copies_mu;
  const char* begin = subject.data();
  const char* end = begin + subject.size();
  pool.ParallelFor(static_cast<int64_t>(starts.size()), [&](int thread, int64_t task) {
    const size_t c = static_cast<size_t>(task);
    const size_t stop = c + 1 < starts.size() ? starts[c + 1] : level.size();
    std::vector<std::string_view>& out = outputs[c];
    out.assign(level.begin() + static_cast<ptrdiff_t>(starts[c]),
               level.begin() + static_cast<ptrdiff_t>(stop));
    ApplySteps(1, &scratch[static_cast<size_t>(thread)], &out);
    for (std::string_view& p : out) {
      if (p.data() < begin || p.data() + p.size() > end) {  // views the thread's scratch
        std::lock_guard<std::mutex> lock(copies_mu);
        p = copies->emplace_back(p);
      }
    }
  });
  for (const auto& out : outputs) pieces->insert(pieces->end(), out.begin(), out.end());
}

void PreTokenizer::SplitPiece(std::string_view piece, const CompiledStep& compiled,
                              Scratch* scratch, const std::vector<Regex::Match>* matches) const {
  const PreTokenizerStep& step = compiled.step;
  // The piece as alternating non-matches and matches (HF's find_matches), empty ones included:
  // they still take part in merging below.
  std::vector<Part>& parts = scratch->parts;
  parts.clear();
  size_t prev = 0;
  auto add_match = [&](size_t begin, size_t end) {
    if (begin != prev) parts.emplace_back(piece.substr(prev, begin - prev), false);
    parts.emplace_back(piece.substr(begin, end - begin), true);
    prev = end;
  };
  if (compiled.regex) {
    if (matches == nullptr) {
      compiled.regex->FindAll(piece, &scratch->matches);
      matches = &scratch->matches;
    }
    for (const Regex::Match& m : *matches) add_match(m.begin, m.end);
  } else if (!step.pattern.empty()) {
    for (size_t at = piece.find(step.pattern); at != std::string_view::npos;
         at = piece.find(step.pattern, at + step.pattern.size())) {
      add_match(at, at + step.pattern.size());
    }
  }
  if (prev != piece.size()) parts.emplace_back(piece.substr(prev), false);
  if (step.invert) {
    for (Part& p : parts) p.second = !p.second;
  }

  SplitBehavior behavior = step.behavior;
  if (step.kind == PreTokenizerStep::Kind::kDigits) {
    behavior = step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
  } else if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
    behavior = SplitBehavior::kIsolated;
  }

  std::vector<std::string_view>& out = scratch->next;
  const size_t first = out.size();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) out.push_back(p.first);
      break;
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.second) out.push_back(p.first);
      }
      break;
    case SplitBehavior::kContiguous:
      for (const Part& p : parts) {
        if (out.size() > first && p.second == previous_match) {
          out.back() = Join(out.back(), p.first);
        } else {
          out.push_back(p.first);
        }
        previous_match = p.second;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (out.size() > first && p.second && !previous_match) {
          out.back() = Join(out.back(), p.first);
        } else {
          out.push_back(p.first);
        }
        previous_match = p.second;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (out.size() > first && it->second && !previous_match) {
          out.back() = Join(it->first, out.back());
        } else {
          out.push_back(it->first);
        }
        previous_match = it->second;
      }
      std::reverse(out.begin() + static_cast<ptrdiff_t>(first), out.end());
      break;
  }
  out.erase(std::remove_if(out.begin() + static_cast<ptrdiff_t>(first), out.end(),
                           [](std::string_view v) { return v.empty(); }),
            out.end());
}

}  // namespace dinfer::tokenizer
