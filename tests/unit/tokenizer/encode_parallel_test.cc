// EncodeSegments on a thread pool gives the sequential ids, for every derived tokenizer variant
// (normalizers, prefix spaces, added tokens with lstrip/rstrip), on prompts with many short runs
// and with runs long enough to be cut into chunks.

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/thread_pool.h"
#include "unit/tokenizer/test_util.h"

namespace dinfer::tokenizer {
namespace {

using testutil::FileExists;
using testutil::TokenizersDir;

// A chat-shaped prompt from the corpus: markup the template wrote, then message text (which
// holds special-token strings of its own); `long_runs` makes some messages long enough to be
// cut into chunks.
std::vector<PromptSegment> Prompt(const std::vector<std::string>& corpus, int messages,
                                  bool long_runs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<PromptSegment> segments;
  for (int m = 0; m < messages; ++m) {
    segments.push_back({m % 2 ? "<|im_start|>assistant\n" : "<|im_start|>user\n", true});
    std::string text;
    const size_t target = long_runs && m % 3 == 0 ? 60000 : 1000 + rng() % 4000;
    while (text.size() < target) {
      text += corpus[rng() % corpus.size()];
      text += rng() % 4 ? " " : "\n\n";
    }
    segments.push_back({text, false});
    segments.push_back({"<|im_end|>\n", true});
  }
  segments.push_back({"<|im_start|>assistant\n", true});
  return segments;
}

class EncodeParallelTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!FileExists(TokenizersDir() + "/" + GetParam() + "/tokenizer.json")) {
      GTEST_SKIP() << testutil::kMissingTokenizers;
    }
    tok_ = testutil::TokenizerWithSpecials(GetParam(), {});
    ASSERT_NE(tok_, nullptr);
    for (const auto& row : testutil::ReadJsonl(testutil::FixturesDir() + "/corpus.jsonl")) {
      corpus_.emplace_back(row.at("text").as_string());
    }
    ASSERT_GT(corpus_.size(), 100u);
  }

  const Tokenizer* tok_ = nullptr;
  std::vector<std::string> corpus_;
};

TEST_P(EncodeParallelTest, SameIdsAsSequential) {
  ThreadPool two(2), three(3);
  for (bool long_runs : {false, true}) {
    const std::vector<PromptSegment> prompt = Prompt(corpus_, 10, long_runs, long_runs ? 7 : 3);
    const std::vector<int32_t> sequential = tok_->EncodeSegments(prompt);
    ASSERT_GT(sequential.size(), 10000u);
    EXPECT_EQ(tok_->EncodeSegments(prompt, &two), sequential) << "long runs: " << long_runs;
    EXPECT_EQ(tok_->EncodeSegments(prompt, &three), sequential) << "long runs: " << long_runs;
  }
  // One long message alone: its pieces are the only parallel work.
  const std::vector<PromptSegment> single = {{Prompt(corpus_, 1, true, 11)[1].text, false}};
  EXPECT_EQ(tok_->EncodeSegments(single, &two), tok_->EncodeSegments(single));
}

TEST_P(EncodeParallelTest, HugeMessagesArePreTokenizedInParallel) {
  // Messages long enough for PreTokenizer::SplitParallel, alone and among others.
  std::string huge;
  std::mt19937 rng(13);
  while (huge.size() < 600000) {
    huge += corpus_[rng() % corpus_.size()];
    huge += rng() % 3 ? " " : (rng() % 2 ? "\n" : std::string(1 + rng() % 300, ' '));
  }
  ThreadPool three(3);
  const std::vector<PromptSegment> alone = {{huge, false}};
  // Request text is encoded without the added vocabulary, in parallel as in sequence.
  EXPECT_EQ(tok_->EncodeSegments(alone, &three), tok_->EncodeSegments(alone));
  std::vector<PromptSegment> chat = Prompt(corpus_, 4, false, 5);
  chat.insert(chat.begin() + 4, {{huge, false}, {"<|im_end|>", true}});
  EXPECT_EQ(tok_->EncodeSegments(chat, &three), tok_->EncodeSegments(chat));
}

INSTANTIATE_TEST_SUITE_P(Variants, EncodeParallelTest,
                         ::testing::Values("smollm2", "llama3", "qwen2", "deepseek_v3", "tekken",
                                           "gpt2_prefix", "splits"));

}  // namespace
}  // namespace dinfer::tokenizer
