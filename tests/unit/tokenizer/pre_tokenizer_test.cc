// Pre-tokenizer and regex unit tests; expected pieces are what HF `tokenizers` 0.23 gives.

#include "tokenizer/pre_tokenizer.h"

#include <iterator>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "base/thread_pool.h"
#include "tokenizer/regex.h"

namespace dinfer::tokenizer {
namespace {

using Pieces = std::vector<std::string>;

Pieces SplitText(std::vector<PreTokenizerStep> steps, std::string_view text) {
  auto pre = PreTokenizer::Create(std::move(steps));
  EXPECT_TRUE(pre.ok()) << pre.status().ToString();
  if (!pre.ok()) return {};
  PreTokenizer::Scratch scratch;
  std::vector<std::string_view> views;
  (*pre)->Split(text, &scratch, &views);
  return Pieces(views.begin(), views.end());
}

PreTokenizerStep Literal(std::string pattern, SplitBehavior behavior, bool invert) {
  PreTokenizerStep step = PreTokenizerStep::SplitRegex(std::move(pattern), behavior);
  step.pattern_is_regex = false;
  step.invert = invert;
  return step;
}

TEST(PreTokenizerTest, SplitBehaviors) {
  const std::string text = "a-b--c-";
  struct Case {
    SplitBehavior behavior;
    Pieces plain, inverted;
  };
  const Case cases[] = {
      {SplitBehavior::kRemoved, {"a", "b", "c"}, {"-", "-", "-", "-"}},
      {SplitBehavior::kIsolated,
       {"a", "-", "b", "-", "-", "c", "-"},
       {"a", "-", "b", "-", "-", "c", "-"}},
      {SplitBehavior::kMergedWithPrevious, {"a-", "b-", "-", "c-"}, {"a", "-b", "-", "-c", "-"}},
      {SplitBehavior::kMergedWithNext, {"a", "-b", "-", "-c", "-"}, {"a-", "b-", "-", "c-"}},
      {SplitBehavior::kContiguous,
       {"a", "-", "b", "--", "c", "-"},
       {"a", "-", "b", "--", "c", "-"}},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(SplitText({Literal("-", c.behavior, false)}, text), c.plain)
        << static_cast<int>(c.behavior);
    EXPECT_EQ(SplitText({Literal("-", c.behavior, true)}, text), c.inverted)
        << static_cast<int>(c.behavior);
    PreTokenizerStep regex = PreTokenizerStep::SplitRegex("-", c.behavior);
    EXPECT_EQ(SplitText({regex}, text), c.plain);
  }
}

TEST(PreTokenizerTest, Digits) {
  EXPECT_EQ(SplitText({PreTokenizerStep::Digits(false)}, "abc123d4 5"),
            (Pieces{"abc", "123", "d", "4", " ", "5"}));
  EXPECT_EQ(SplitText({PreTokenizerStep::Digits(true)}, "abc123d4 5"),
            (Pieces{"abc", "1", "2", "3", "d", "4", " ", "5"}));
  // Any Unicode number, not only ASCII digits.
  EXPECT_EQ(SplitText({PreTokenizerStep::Digits(true)}, "x٣½"), (Pieces{"x", "٣", "½"}));
}

TEST(PreTokenizerTest, ByteLevel) {
  EXPECT_EQ(SplitText({PreTokenizerStep::ByteLevel(true, false)}, "hello world"),
            (Pieces{" hello world"}));
  EXPECT_EQ(SplitText({PreTokenizerStep::ByteLevel(false, true)}, "I'm   fine,  thanks!!\n\n  ok"),
            (Pieces{"I", "'m", "  ", " fine", ",", " ", " thanks", "!!", "\n\n ", " ok"}));
  // The prefix space goes on every piece an earlier step made.
  EXPECT_EQ(SplitText({PreTokenizerStep::SplitRegex(R"(\s+)", SplitBehavior::kRemoved),
                       PreTokenizerStep::ByteLevel(true, true)},
                      "hi  there\nyou"),
            (Pieces{" hi", " there", " you"}));
  EXPECT_TRUE(SplitText({PreTokenizerStep::ByteLevel(true, true)}, "").empty());
}

TEST(PreTokenizerTest, ByteLevelMustBeLast) {
  auto pre = PreTokenizer::Create(
      {PreTokenizerStep::ByteLevel(false, true), PreTokenizerStep::Digits(true)});
  EXPECT_EQ(pre.status().code(), StatusCode::kUnimplemented);
}

TEST(PreTokenizerTest, BadRegexIsAnError) {
  auto pre = PreTokenizer::Create({PreTokenizerStep::SplitRegex("(unclosed")});
  ASSERT_FALSE(pre.ok());
  EXPECT_EQ(pre.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pre.status().message().find("(unclosed"), std::string::npos);
}

TEST(RegexTest, EmptyMatchesFollowOniguruma) {
  auto re = Regex::Compile("x*");
  ASSERT_TRUE(re.ok());
  std::vector<Regex::Match> m;
  (*re)->FindAll("abxxc", &m);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].begin, 0u);
  EXPECT_EQ(m[1].begin, 1u);
  EXPECT_EQ(m[2].begin, 2u);
  EXPECT_EQ(m[2].end, 4u);
  EXPECT_EQ(m[3].begin, 5u);
  EXPECT_EQ(SplitText({PreTokenizerStep::SplitRegex("x*")}, "abxxc"),
            (Pieces{"a", "b", "xx", "c"}));
  EXPECT_EQ(SplitText({PreTokenizerStep::SplitRegex("x*", SplitBehavior::kRemoved)}, "abxxc"),
            (Pieces{"a", "b", "c"}));
}

TEST(RegexTest, OnigurumaClasses) {
  EXPECT_EQ(TranslateOnigurumaPattern(R"(a\sb)").find(R"(\s)"), std::string::npos);
  EXPECT_EQ(TranslateOnigurumaPattern(R"([\S])"), R"([\S])");
  EXPECT_EQ(TranslateOnigurumaPattern(R"(\\s)"), R"(\\s)");  // an escaped backslash, then 's'
  EXPECT_EQ(TranslateOnigurumaPattern(R"(\h+)"), "[0-9a-fA-F]+");
  EXPECT_EQ(TranslateOnigurumaPattern("[[:alpha:]\\s]"),
            std::string("[[:alpha:]") + TranslateOnigurumaPattern(R"(\s)").substr(1));
  // Oniguruma's \s: U+0085 and U+2028 are spaces, U+180E and U+200B are not.
  auto re = Regex::Compile(R"(\s+)");
  ASSERT_TRUE(re.ok());
  std::vector<Regex::Match> m;
  (*re)->FindAll("a\u180eb\u0085c\u200bd\u2028e", &m);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].end - m[0].begin, 2u);  // U+0085
  EXPECT_EQ(m[1].end - m[1].begin, 3u);  // U+2028
}

TEST(RegexTest, CaseInsensitiveContractionsFoldLikeHf) {
  // (?i) folds U+017F (long s) to 's' and U+212A (Kelvin) to 'k'.
  auto re = Regex::Compile("(?i:'s|'k)");
  ASSERT_TRUE(re.ok());
  std::vector<Regex::Match> m;
  (*re)->FindAll("a'\u017fb'\u212a", &m);
  EXPECT_EQ(m.size(), 2u);
}

TEST(RegexTest, IllFormedUtf8NeverMatchesNorBreaks) {
  auto re = Regex::Compile(R"(\p{L}+)");
  ASSERT_TRUE(re.ok());
  std::vector<Regex::Match> m;
  (*re)->FindAll(
      "ab\xff\xfe"
      "cd\xe2\x82",
      &m);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].begin, 0u);
  EXPECT_EQ(m[1].begin, 4u);
  EXPECT_EQ(m[1].end, 6u);
}

// A long subject mixing words, digits, punctuation, CJK, runs of spaces and newlines (where cuts
// fall inside matches that lookaheads decide) and ill-formed bytes.
std::string LongSubject(uint32_t seed) {
  const char* parts[] = {
      "Hello",   " world", "   ", "\n\n", "  \n  ", "123456", "don't", "\t", "日本語のテキスト",
      "émoji 😀", "!!!",    "a",   "\xff", "  x",    "\r\n"};
  std::mt19937 rng(seed);
  std::string s;
  while (s.size() < 400000) {
    s += parts[rng() % std::size(parts)];
    if (rng() % 50 == 0) s += std::string(1 + rng() % 3000, ' ');  // a long run of spaces
  }
  return s;
}

TEST(RegexTest, ParallelSearchFindsTheSameMatches) {
  const std::string patterns[] = {
      std::string(kGpt2Pattern),
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"(\p{N})",
      R"(\s*)",     // empty matches everywhere
      R"((?=\S))",  // only empty matches
      R"(^\s*\S)",  // anchored at line starts
      R"(\s{5,})",  // sparse matches
  };
  ThreadPool two(2), four(4);
  for (const std::string& pattern : patterns) {
    auto re = Regex::Compile(pattern);
    ASSERT_TRUE(re.ok()) << re.status().ToString();
    for (uint32_t seed : {1u, 2u}) {
      const std::string subject = LongSubject(seed);
      std::vector<Regex::Match> sequential, parallel;
      (*re)->FindAll(subject, &sequential);
      for (ThreadPool* pool : {&two, &four}) {
        (*re)->FindAllParallel(subject, *pool, &parallel);
        ASSERT_EQ(parallel.size(), sequential.size()) << pattern;
        for (size_t i = 0; i < sequential.size(); ++i) {
          ASSERT_TRUE(parallel[i].begin == sequential[i].begin &&
                      parallel[i].end == sequential[i].end)
              << pattern << " match " << i;
        }
      }
    }
  }
}

TEST(PreTokenizerTest, ParallelSplitGivesTheSamePieces) {
  const std::string text = LongSubject(3);
  PreTokenizerStep digits = PreTokenizerStep::Digits(false);
  PreTokenizerStep inverted = Literal(" ", SplitBehavior::kMergedWithNext, true);
  const std::vector<std::vector<PreTokenizerStep>> configs = {
      {PreTokenizerStep::Digits(true), PreTokenizerStep::ByteLevel(false, true)},
      {PreTokenizerStep::SplitRegex(R"(\s+(?!\S)|\s+|\p{L}+|\p{N}{1,3}|[^\s\p{L}\p{N}]+)"),
       PreTokenizerStep::ByteLevel(false, false)},
      {PreTokenizerStep::ByteLevel(true, true)},
      {PreTokenizerStep::SplitRegex(R"(\p{P}+)", SplitBehavior::kMergedWithPrevious), digits},
      {PreTokenizerStep::SplitRegex(R"(\s+)", SplitBehavior::kContiguous),
       PreTokenizerStep::ByteLevel(true, true)},
      {inverted, Literal("l", SplitBehavior::kRemoved, false)},
      {Literal("\n", SplitBehavior::kIsolated, false)},
  };
  ThreadPool pool(3);
  for (size_t i = 0; i < configs.size(); ++i) {
    auto pre = PreTokenizer::Create(configs[i]);
    ASSERT_TRUE(pre.ok()) << pre.status().ToString();
    PreTokenizer::Scratch scratch;
    std::vector<std::string_view> sequential, parallel;
    (*pre)->Split(text, &scratch, &sequential);
    const Pieces want(sequential.begin(), sequential.end());
    std::vector<PreTokenizer::Scratch> scratches(3);
    std::deque<std::string> copies;
    (*pre)->SplitParallel(text, pool, scratches, &parallel, &copies);
    EXPECT_EQ(Pieces(parallel.begin(), parallel.end()), want) << "config " << i;
  }
}

}  // namespace
}  // namespace dinfer::tokenizer
