// Speculative decoding with DeepSeek-V4's MTP layer as the draft: greedy or sampled (seeded, with
// penalties), the engine emits exactly the tokens it emits without speculation, in batches of mixed
// lengths, with prefix cache hits and with preemption; verification accepts some drafts and reports
// how many.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <thread>

#include "base/mapped_file.h"
#include "dinfer/engine.h"
#include "engine/engine_core.h"
#include "model/loader.h"

namespace dinfer {
namespace {

std::string Dir(const std::string& variant) {
  return std::string(DINFER_SOURCE_DIR) + "/tests/data/models/" + variant;
}

// The fixture's prompt, and prompts of other lengths made from it.
std::vector<std::vector<int32_t>> Prompts(const Model& model) {
  std::vector<int32_t> base;
  const int64_t vocab = model.config().vocab_size;
  for (int64_t i = 0; i < 64; ++i) base.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  std::vector<std::vector<int32_t>> out;
  for (size_t n : {64u, 9u, 33u, 50u, 17u}) out.emplace_back(base.begin(), base.begin() + n);
  // A repeated pattern, which the draft layer predicts more often.
  std::vector<int32_t> repeated;
  for (int i = 0; i < 40; ++i) repeated.push_back(static_cast<int32_t>((100 + i % 5) % vocab));
  out.push_back(repeated);
  return out;
}

struct Outcome {
  std::map<int64_t, std::vector<int32_t>> tokens;
  EngineStats stats;
};

RequestOptions Greedy() {
  RequestOptions o;
  o.sampling.temperature = 0.0;
  return o;
}

// Temperature, top-p, penalties and min_tokens, seeded.
RequestOptions Sampled() {
  RequestOptions o;
  o.sampling.temperature = 0.8;
  o.sampling.top_p = 0.95;
  o.sampling.repetition_penalty = 1.1;
  o.sampling.frequency_penalty = 0.2;
  o.sampling.min_tokens = 3;
  o.sampling.seed = 7;
  o.has_seed = true;
  return o;
}

// Runs every prompt (ids 1, 2, ...) with `options` (greedy by default): all at once, or one after
// the other; up to `max_tokens` each, or 6 to 18 by request when 0.
Outcome RunAll(Model& model, const EngineConfig& cfg,
               const std::vector<std::vector<int32_t>>& prompts, bool together,
               RequestOptions options = Greedy(), int64_t max_tokens = 0) {
  EngineCore core(model, cfg);
  options.ignore_eos = true;
  Outcome out;
  auto drain = [&] {
    while (core.HasWork()) {
      for (const TokenDelta& d : core.Step()) {
        EXPECT_NE(d.finish, FinishReason::kError) << d.error;
        auto& t = out.tokens[d.request_id];
        t.insert(t.end(), d.tokens.begin(), d.tokens.end());
      }
      EXPECT_TRUE(core.kv().CheckInvariants().ok());
    }
  };
  for (size_t i = 0; i < prompts.size(); ++i) {
    options.max_tokens = max_tokens > 0 ? max_tokens : 6 + static_cast<int64_t>(i * 5 % 13);
    EXPECT_TRUE(core.AddRequest(static_cast<int64_t>(i) + 1, prompts[i], options).ok());
    if (!together) drain();
  }
  drain();
  out.stats = core.Stats();
  return out;
}

class SpeculativeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto lm = LoadModel(Dir("deepseek_v4"), LoadOptions{false, false});
    ASSERT_TRUE(lm.ok()) << lm.status().ToString();
    lm_ = new LoadedModel(std::move(*lm));
  }
  static void TearDownTestSuite() {
    delete lm_;
    lm_ = nullptr;
  }
  static LoadedModel* lm_;
};
LoadedModel* SpeculativeTest::lm_ = nullptr;

// One engine setup of the equivalence tests: KV blocks, chunking, prefix caching, and whether
// the requests arrive together or one after the other.
struct Variant {
  int64_t block_size, num_kv_blocks, max_batched;
  bool caching, together, sampled = false;
};

std::string Describe(const Variant& v) {
  return fmt::format("block {} blocks {} caching {} together {} sampled {}", v.block_size,
                     v.num_kv_blocks, v.caching, v.together, v.sampled);
}

// The engine configuration of a variant, without speculation.
EngineConfig ConfigFor(const Variant& v) {
  EngineConfig cfg;
  cfg.threads = 2;
  cfg.block_size = v.block_size;
  cfg.num_kv_blocks = v.num_kv_blocks;
  cfg.enable_prefix_caching = v.caching;
  cfg.kv_cache_dtype = KvCacheDType::kF32;
  cfg.scheduler.max_num_batched_tokens = v.max_batched;
  return cfg;
}

TEST_F(SpeculativeTest, OutputsMatchDecodingWithoutSpeculation) {
  Model& model = *lm_->model;
  ASSERT_TRUE(model.has_draft_layer());
  const auto prompts = Prompts(model);
  const Variant variants[] = {
      {16, 64, 64, true, true},        // a batch of mixed lengths
      {4, 200, 27, true, false},       // one after the other: prefix cache hits
      {4, 200, 19, false, true},       // blocks of 4 without the prefix cache
      {4, 30, 19, true, true},         // a cache too small for all: preemption
      {16, 9, 64, false, true},        // preemption with blocks of 16
      {16, 64, 64, true, true, true},  // sampled (temperature, top-p, penalties, min_tokens)
      {4, 30, 19, true, true, true},   // sampled, with preemption
  };
  int64_t drafts = 0, accepted = 0;
  for (const Variant& v : variants) {
    SCOPED_TRACE(Describe(v));
    EngineConfig cfg = ConfigFor(v);
    const RequestOptions options = v.sampled ? Sampled() : Greedy();
    const Outcome plain = RunAll(model, cfg, prompts, v.together, options);
    cfg.num_speculative_tokens = 1;
    const Outcome spec = RunAll(model, cfg, prompts, v.together, options);
    ASSERT_EQ(plain.tokens.size(), prompts.size());
    for (const auto& [id, tokens] : plain.tokens) {
      EXPECT_EQ(spec.tokens.at(id), tokens) << "request " << id;
    }
    EXPECT_EQ(spec.stats.generated_tokens, plain.stats.generated_tokens);
    EXPECT_GT(spec.stats.draft_tokens, 0);
    EXPECT_LE(spec.stats.accepted_draft_tokens, spec.stats.draft_tokens);
    if (v.num_kv_blocks < 64) {
      EXPECT_GT(spec.stats.preemptions, 0);
    }
    if (v.caching && !v.together) {
      EXPECT_GT(spec.stats.kv.prefix_hits, 0);
    }
    std::printf("block %lld: %lld of %lld drafts accepted, %lld steps (%lld without)\n",
                static_cast<long long>(v.block_size),
                static_cast<long long>(spec.stats.accepted_draft_tokens),
                static_cast<long long>(spec.stats.draft_tokens),
                static_cast<long long>(spec.stats.steps),
                static_cast<long long>(plain.stats.steps));
    drafts += spec.stats.draft_tokens;
    accepted += spec.stats.accepted_draft_tokens;
  }
  // The tiny random model's MTP layer is no predictor (its transformers fixture's MTP rows never
  // give the token after next either), so drafts are mostly rejected: AcceptedDraftsGiveTheSame-
  // Tokens covers acceptance.
  std::printf("acceptance rate %.3f (%lld of %lld)\n",
              static_cast<double>(accepted) / static_cast<double>(drafts),
              static_cast<long long>(accepted), static_cast<long long>(drafts));
}

// Sampled requests (temperature, top-p, penalties, min_tokens) speculate too and give the same
// tokens as without speculation; a request asking for logprobs decodes as usual next to them.
TEST_F(SpeculativeTest, SampledRequestsSpeculateWithTheSameTokens) {
  Model& model = *lm_->model;
  const auto prompts = Prompts(model);
  std::map<int64_t, std::vector<int32_t>> got[2];
  for (int k : {0, 1}) {
    EngineConfig cfg;
    cfg.threads = 2;
    cfg.num_kv_blocks = 64;
    cfg.num_speculative_tokens = k;
    EngineCore core(model, cfg);
    RequestOptions sampled = Sampled();
    sampled.max_tokens = 12;
    sampled.ignore_eos = true;
    RequestOptions logprobs = sampled;
    logprobs.sampling.logprobs = 2;
    RequestOptions greedy = sampled;
    greedy.sampling.temperature = 0.0;
    ASSERT_TRUE(core.AddRequest(1, prompts[0], sampled).ok());
    ASSERT_TRUE(core.AddRequest(2, prompts[1], logprobs).ok());
    ASSERT_TRUE(core.AddRequest(3, prompts[5], greedy).ok());
    while (core.HasWork()) {
      for (const TokenDelta& d : core.Step()) {
        auto& t = got[k][d.request_id];
        t.insert(t.end(), d.tokens.begin(), d.tokens.end());
      }
    }
    if (k == 1) {
      EXPECT_GT(core.Stats().draft_tokens, 0);
    }
  }
  EXPECT_EQ(got[0], got[1]);
  // The sampled request alone gets drafts.
  EngineConfig cfg;
  cfg.threads = 2;
  cfg.num_kv_blocks = 64;
  cfg.num_speculative_tokens = 1;
  const Outcome spec = RunAll(model, cfg, {prompts[0]}, true, Sampled());
  EXPECT_GT(spec.stats.draft_tokens, 0);
}

TEST_F(SpeculativeTest, StopTokensEndTheOutputAtTheFirstOne) {
  Model& model = *lm_->model;
  const auto prompts = Prompts(model);
  EngineConfig cfg;
  cfg.threads = 2;
  cfg.num_kv_blocks = 64;
  RequestOptions greedy;
  greedy.sampling.temperature = 0.0;
  greedy.max_tokens = 16;
  std::vector<int32_t> reference;
  {
    EngineCore core(model, cfg);
    greedy.ignore_eos = true;
    ASSERT_TRUE(core.AddRequest(1, prompts[5], greedy).ok());
    while (core.HasWork()) {
      for (const TokenDelta& d : core.Step())
        reference.insert(reference.end(), d.tokens.begin(), d.tokens.end());
    }
  }
  ASSERT_GE(reference.size(), 4u);
  // Stop on each generated token in turn: the output ends at its first occurrence.
  for (size_t stop_at = 1; stop_at < reference.size(); stop_at += 3) {
    cfg.num_speculative_tokens = 1;
    EngineCore core(model, cfg);
    greedy.ignore_eos = false;
    greedy.stop_token_ids = {reference[stop_at]};
    ASSERT_TRUE(core.AddRequest(1, prompts[5], greedy).ok());
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::kNone;
    while (core.HasWork()) {
      for (const TokenDelta& d : core.Step()) {
        tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.end());
        if (d.finish != FinishReason::kNone) finish = d.finish;
      }
    }
    const auto first = std::find(reference.begin(), reference.end(), reference[stop_at]);
    EXPECT_EQ(tokens, std::vector<int32_t>(reference.begin(), first + 1)) << "stop at " << stop_at;
    EXPECT_EQ(finish, FinishReason::kStop);
  }
}

// The DeepSeek-V4 model with a draft that knows the greedy continuation of one sequence: it runs
// the real MTP layer (its KV stays as in real use) and then, for rows whose input token is the
// sequence's, puts the logits on the sequence's next token with certainty, except where `guess`
// says otherwise: at every third position by default it keeps the MTP layer's guess (which the
// tiny random model rarely gets right, and is never sure of); kWrong puts them on another token,
// with certainty too. Verification then accepts and rejects drafts at many places.
class OracleDraft : public Model {
 public:
  enum class Guess { kModel, kRight, kWrong };
  OracleDraft(
      Model& inner, std::vector<int32_t> sequence,
      std::function<Guess(size_t)> guess =
          [](size_t pos) { return pos % 3 == 0 ? Guess::kModel : Guess::kRight; })
      : Model(inner.config()),
        inner_(inner),
        sequence_(std::move(sequence)),
        guess_(std::move(guess)) {}
  KvLayout KvLayoutFor(int64_t block_size) const override { return inner_.KvLayoutFor(block_size); }
  std::vector<KvGroup> KvGroupsFor(int64_t block_size) const override {
    return inner_.KvGroupsFor(block_size);
  }
  Status Forward(const ops::OpContext& ctx, const ForwardInput& in, const KvStorage& kv,
                 const TensorView& logits) override {
    return inner_.Forward(ctx, in, kv, logits);
  }
  bool has_draft_layer() const override { return true; }
  Status ForwardDraft(const ops::OpContext& ctx, const ForwardInput& in, const KvStorage& kv,
                      const TensorView& logits) override {
    DINFER_RETURN_IF_ERROR(inner_.ForwardDraft(ctx, in, kv, logits));
    const int64_t vocab = config().vocab_size;
    for (size_t i = 0; i < in.logits_rows.size(); ++i) {
      const int32_t t = in.logits_rows[i];
      const auto pos = static_cast<size_t>(in.meta.positions[static_cast<size_t>(t)]);
      if (pos + 2 >= sequence_.size()) continue;
      const Guess guess = guess_(pos);
      if (guess == Guess::kModel) continue;
      if (in.tokens[static_cast<size_t>(t)] != sequence_[pos + 1]) continue;
      float* row = logits.as<float>() + static_cast<int64_t>(i) * vocab;
      std::fill(row, row + vocab, -1.0f);
      const int32_t right = sequence_[pos + 2];
      row[guess == Guess::kRight ? right : (right + 1) % vocab] = 30.0f;
    }
    return OkStatus();
  }

 private:
  Model& inner_;
  std::vector<int32_t> sequence_;
  std::function<Guess(size_t)> guess_;
};

// The longest continuation of `prompt` among `outputs`, after the prompt: the sequence an oracle
// draft knows (every request continues the prompt the same way, greedy or sampled with one seed).
std::vector<int32_t> Continuation(const std::vector<int32_t>& prompt, const Outcome& outcome) {
  std::vector<int32_t> sequence = prompt;
  for (const auto& [id, tokens] : outcome.tokens) {
    if (prompt.size() + tokens.size() > sequence.size()) {
      sequence = prompt;
      sequence.insert(sequence.end(), tokens.begin(), tokens.end());
    }
  }
  return sequence;
}

class AcceptedDraftsTest : public SpeculativeTest, public ::testing::WithParamInterface<bool> {};

// Greedy (false) and sampled (true) requests.
TEST_P(AcceptedDraftsTest, GiveTheSameTokens) {
  Model& model = *lm_->model;
  const std::vector<int32_t> prompt = Prompts(model)[3];
  const RequestOptions options = GetParam() ? Sampled() : Greedy();
  const Variant variants[] = {
      {16, 64, 64, true, true},   // three at once
      {4, 200, 27, true, false},  // one after the other: prefix cache hits
      {4, 20, 19, true, true},    // a cache too small for all: preemption
      {16, 8, 64, false, true},   // preemption with blocks of 16
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(Describe(v));
    EngineConfig cfg = ConfigFor(v);
    const std::vector<std::vector<int32_t>> prompts(3, prompt);
    const Outcome plain = RunAll(model, cfg, prompts, v.together, options);
    OracleDraft oracle(model, Continuation(prompt, plain));
    cfg.num_speculative_tokens = 1;
    const Outcome spec = RunAll(oracle, cfg, prompts, v.together, options);
    for (const auto& [id, tokens] : plain.tokens) {
      EXPECT_EQ(spec.tokens.at(id), tokens) << "request " << id;
    }
    EXPECT_GT(spec.stats.accepted_draft_tokens, 0);
    EXPECT_LT(spec.stats.accepted_draft_tokens, spec.stats.draft_tokens);
    EXPECT_LT(spec.stats.steps, plain.stats.steps);
    if (v.num_kv_blocks < 64) {
      EXPECT_GT(spec.stats.preemptions, 0);
    }
    if (v.caching && !v.together) {
      EXPECT_GT(spec.stats.kv.prefix_hits, 0);
    }
    std::printf(
        "oracle draft, block %lld: %lld of %lld drafts accepted, %lld steps (%lld without)\n",
        static_cast<long long>(v.block_size),
        static_cast<long long>(spec.stats.accepted_draft_tokens),
        static_cast<long long>(spec.stats.draft_tokens), static_cast<long long>(spec.stats.steps),
        static_cast<long long>(plain.stats.steps));
  }
}

INSTANTIATE_TEST_SUITE_P(GreedyAndSampled, AcceptedDraftsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Sampled" : "Greedy";
                         });

void PrintDrafts(const char* what, const EngineStats& s) {
  std::printf(
      "%s: %lld of %lld drafts accepted, %lld of low confidence, %lld paused; %lld steps, %lld "
      "tokens computed\n",
      what, static_cast<long long>(s.accepted_draft_tokens), static_cast<long long>(s.draft_tokens),
      static_cast<long long>(s.low_confidence_drafts), static_cast<long long>(s.paused_drafts),
      static_cast<long long>(s.steps), static_cast<long long>(s.computed_tokens));
}

EngineConfig SpecConfig() {
  EngineConfig cfg;
  cfg.threads = 2;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 200;
  cfg.kv_cache_dtype = KvCacheDType::kF32;
  cfg.scheduler.max_num_batched_tokens = 64;
  cfg.num_speculative_tokens = 1;
  // Speculation steps synchronously; so does decoding without it here, step for step.
  cfg.async_scheduling = false;
  return cfg;
}

class ConfidenceTest : public SpeculativeTest, public ::testing::WithParamInterface<bool> {};

// The oracle is sure of its drafts at two positions in three and leaves the MTP layer's unsure
// guess at the third. With a threshold only the sure drafts are proposed: the outputs stay those
// without speculation, the acceptance rate rises and fewer tokens are computed (a rejected draft
// costs its token and the recomputation of its block); threshold 0 proposes every draft.
TEST_P(ConfidenceTest, ThresholdProposesOnlyConfidentDrafts) {
  Model& model = *lm_->model;
  const std::vector<int32_t> prompt = Prompts(model)[3];
  const RequestOptions options = GetParam() ? Sampled() : Greedy();
  const std::vector<std::vector<int32_t>> prompts(3, prompt);
  EngineConfig cfg = SpecConfig();
  cfg.num_speculative_tokens = 0;
  const Outcome plain = RunAll(model, cfg, prompts, true, options, 24);
  OracleDraft oracle(model, Continuation(prompt, plain));
  cfg.num_speculative_tokens = 1;
  const Outcome every = RunAll(oracle, cfg, prompts, true, options, 24);
  cfg.draft_policy.min_confidence = 0.0;
  const Outcome zero = RunAll(oracle, cfg, prompts, true, options, 24);
  cfg.draft_policy.min_confidence = 0.5;
  const Outcome sure = RunAll(oracle, cfg, prompts, true, options, 24);
  for (const auto& [id, tokens] : plain.tokens) {
    EXPECT_EQ(every.tokens.at(id), tokens) << "request " << id;
    EXPECT_EQ(zero.tokens.at(id), tokens) << "request " << id;
    EXPECT_EQ(sure.tokens.at(id), tokens) << "request " << id;
  }
  PrintDrafts("no speculation", plain.stats);
  PrintDrafts("no threshold", every.stats);
  PrintDrafts("threshold 0.5", sure.stats);
  // Threshold 0 is the default: every draft, step for step.
  EXPECT_EQ(zero.stats.draft_tokens, every.stats.draft_tokens);
  EXPECT_EQ(zero.stats.accepted_draft_tokens, every.stats.accepted_draft_tokens);
  EXPECT_EQ(zero.stats.steps, every.stats.steps);
  EXPECT_EQ(zero.stats.computed_tokens, every.stats.computed_tokens);
  EXPECT_EQ(every.stats.low_confidence_drafts, 0);
  EXPECT_EQ(every.stats.paused_drafts, 0);
  // The MTP layer's guesses go; the oracle's stay, and nearly all are accepted.
  EXPECT_GT(sure.stats.low_confidence_drafts, 0);
  EXPECT_EQ(sure.stats.paused_drafts, 0);
  EXPECT_GT(sure.stats.accepted_draft_tokens, 0);
  EXPECT_LT(sure.stats.draft_tokens, every.stats.draft_tokens);
  const auto rate = [](const EngineStats& s) {
    return static_cast<double>(s.accepted_draft_tokens) / static_cast<double>(s.draft_tokens);
  };
  EXPECT_GT(rate(sure.stats), rate(every.stats));
  EXPECT_GE(rate(sure.stats), 0.9);
  EXPECT_LT(sure.stats.computed_tokens, every.stats.computed_tokens);
  EXPECT_LT(sure.stats.steps, plain.stats.steps);
  // A threshold above every confidence proposes nothing: plain decoding.
  cfg.draft_policy.min_confidence = 1.0;
  const Outcome none = RunAll(model, cfg, prompts, true, options, 24);
  EXPECT_EQ(none.tokens, plain.tokens);
  EXPECT_EQ(none.stats.draft_tokens, 0);
  EXPECT_GT(none.stats.low_confidence_drafts, 0);
  EXPECT_EQ(none.stats.steps, plain.stats.steps);
  EXPECT_EQ(none.stats.computed_tokens, plain.stats.computed_tokens);
}

INSTANTIATE_TEST_SUITE_P(GreedyAndSampled, ConfidenceTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Sampled" : "Greedy";
                         });

// The real MTP layer's drafts keep failing on the random model: with a minimum acceptance a
// request stops drafting after a few and then only probes, once every probe_interval steps.
TEST_F(SpeculativeTest, AdaptivePolicyPausesFailingDraftsAndProbes) {
  Model& model = *lm_->model;
  const std::vector<std::vector<int32_t>> prompts = {Prompts(model)[0]};
  EngineConfig cfg = SpecConfig();
  cfg.num_speculative_tokens = 0;
  const Outcome plain = RunAll(model, cfg, prompts, true, Greedy(), 40);
  cfg.num_speculative_tokens = 1;
  const Outcome every = RunAll(model, cfg, prompts, true, Greedy(), 40);
  cfg.draft_policy.min_acceptance = 0.5;
  cfg.draft_policy.probe_interval = 4;
  const Outcome adaptive = RunAll(model, cfg, prompts, true, Greedy(), 40);
  EXPECT_EQ(every.tokens, plain.tokens);
  EXPECT_EQ(adaptive.tokens, plain.tokens);
  PrintDrafts("every draft", every.stats);
  PrintDrafts("adaptive", adaptive.stats);
  ASSERT_EQ(every.stats.accepted_draft_tokens, 0) << "the fixture's MTP layer got lucky";
  EXPECT_GE(every.stats.draft_tokens, 35);
  // Three failures pause it (1 -> 0.75 -> 0.56 -> 0.42); then a probe follows every three
  // paused steps (the last step's proposal is never verified).
  const int64_t probes = adaptive.stats.draft_tokens - 3;
  EXPECT_GE(probes, 5);
  EXPECT_NEAR(adaptive.stats.paused_drafts, 3 * probes, 4);
  EXPECT_GE(adaptive.stats.draft_tokens + adaptive.stats.paused_drafts, every.stats.draft_tokens);
  EXPECT_EQ(adaptive.stats.low_confidence_drafts, 0);
  EXPECT_LT(adaptive.stats.computed_tokens, every.stats.computed_tokens);
}

// Drafts that are confidently wrong at first pause the request; once they are right, a probe is
// accepted and drafting resumes every step.
TEST_F(SpeculativeTest, AdaptivePolicyResumesAfterAnAcceptedProbe) {
  Model& model = *lm_->model;
  const std::vector<int32_t> prompt = Prompts(model)[3];
  const std::vector<std::vector<int32_t>> prompts = {prompt};
  EngineConfig cfg = SpecConfig();
  cfg.num_speculative_tokens = 0;
  const Outcome plain = RunAll(model, cfg, prompts, true, Greedy(), 40);
  const size_t turn = prompt.size() + 16;  // wrong before, right from here
  OracleDraft oracle(model, Continuation(prompt, plain), [turn](size_t pos) {
    return pos < turn ? OracleDraft::Guess::kWrong : OracleDraft::Guess::kRight;
  });
  cfg.num_speculative_tokens = 1;
  cfg.draft_policy.min_acceptance = 0.5;
  cfg.draft_policy.probe_interval = 4;
  const Outcome adaptive = RunAll(oracle, cfg, prompts, true, Greedy(), 40);
  EXPECT_EQ(adaptive.tokens, plain.tokens);
  PrintDrafts("wrong, then right", adaptive.stats);
  // Paused before the turn (and until the first probe after it) ...
  EXPECT_GT(adaptive.stats.paused_drafts, 0);
  EXPECT_LT(adaptive.stats.paused_drafts, 16);
  // ... drafting every step after it: the 24 tokens after the turn come two a step, and every
  // draft after the accepted probe is accepted.
  EXPECT_GE(adaptive.stats.accepted_draft_tokens, 8);
  EXPECT_LE(adaptive.stats.draft_tokens - adaptive.stats.accepted_draft_tokens, 3 + 16 / 4);
  EXPECT_LT(adaptive.stats.steps, plain.stats.steps - 8);
}

TEST_F(SpeculativeTest, RefusedWithoutADraftLayerOrWithMoreThanOneToken) {
  EngineConfig cfg;
  cfg.num_speculative_tokens = 1;
  EXPECT_TRUE(EngineCore::CheckSpeculation(*lm_->model, cfg).ok());
  cfg.num_speculative_tokens = 2;
  EXPECT_FALSE(EngineCore::CheckSpeculation(*lm_->model, cfg).ok());
  cfg.num_speculative_tokens = -1;
  EXPECT_FALSE(EngineCore::CheckSpeculation(*lm_->model, cfg).ok());
  // Blocks of 12 tokens do not tile the 16-token window that a recomputation reads back.
  cfg.num_speculative_tokens = 1;
  cfg.block_size = 12;
  EXPECT_FALSE(EngineCore::CheckSpeculation(*lm_->model, cfg).ok());
  cfg.block_size = 4;
  EXPECT_TRUE(EngineCore::CheckSpeculation(*lm_->model, cfg).ok());
  auto llama = LoadModel(Dir("llama"), LoadOptions{false, false});
  ASSERT_TRUE(llama.ok()) << llama.status().ToString();
  cfg.num_speculative_tokens = 1;
  const Status s = EngineCore::CheckSpeculation(*llama->model, cfg);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("draft (MTP) layer"), std::string::npos) << s.message();
  cfg.num_speculative_tokens = 0;
  EXPECT_TRUE(EngineCore::CheckSpeculation(*llama->model, cfg).ok());
}

TEST_F(SpeculativeTest, DraftPolicyKnobsAreValidated) {
  EngineConfig cfg;
  cfg.num_speculative_tokens = 1;
  cfg.draft_policy.min_confidence = 1.5;
  Status s = EngineCore::CheckSpeculation(*lm_->model, cfg);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("speculative_min_confidence"), std::string::npos) << s.message();
  cfg.draft_policy.min_confidence = 0.5;
  cfg.draft_policy.min_acceptance = -0.5;
  s = EngineCore::CheckSpeculation(*lm_->model, cfg);
  EXPECT_NE(s.message().find("speculative_min_acceptance"), std::string::npos) << s.message();
  cfg.num_speculative_tokens = 0;
  EXPECT_FALSE(EngineCore::CheckSpeculation(*lm_->model, cfg).ok());
  cfg.draft_policy.min_acceptance = 0.5;
  EXPECT_TRUE(EngineCore::CheckSpeculation(*lm_->model, cfg).ok());
}

// Engine options for the public-API tests: one CPU thread, a small KV cache, one draft token.
EngineOptions ApiOptions(const std::string& variant) {
  EngineOptions o;
  o.model = Dir(variant);
  o.device = "cpu";
  o.threads = 1;
  o.kv_cache_mib = 16;
  o.show_progress = false;
  o.num_speculative_tokens = 1;
  return o;
}

// Runs 8 greedy tokens after a 20-token prompt; returns how many came back and the engine's stats
// once its loop has counted them.
size_t GenerateEight(Engine& engine, EngineStatsSnapshot& stats) {
  RequestSpec spec;
  for (int i = 0; i < 20; ++i) spec.prompt_ids.push_back(10 + i);
  spec.sampling.temperature = 0;
  spec.sampling.max_tokens = 8;
  spec.sampling.ignore_eos = true;
  auto stream = engine.Submit(spec);
  EXPECT_TRUE(stream.ok()) << stream.status().ToString();
  size_t tokens = 0;
  if (stream.ok()) {
    while (auto out = (*stream)->Next()) {
      EXPECT_NE(out->finish_reason, "error") << out->error;
      tokens += out->token_ids.size();
    }
  }
  // Stats are refreshed by the engine's loop after each step.
  stats = engine.Stats();
  for (int i = 0; i < 200 && stats.generated_tokens < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    stats = engine.Stats();
  }
  return tokens;
}

// Through the public API: the option is refused for a model without a draft layer, and the
// engine's stats count the drafts.
TEST(SpeculativeEngineTest, OptionThroughThePublicApi) {
  EngineOptions o = ApiOptions("llama");
  auto refused = Engine::Create(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("draft (MTP) layer"), std::string::npos)
      << refused.status().message();

  o.model = Dir("deepseek_v4");
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EngineStatsSnapshot stats;
  EXPECT_EQ(GenerateEight(**engine, stats), 8u);
  EXPECT_GT(stats.draft_tokens, 0);
  EXPECT_LE(stats.accepted_draft_tokens, stats.draft_tokens);
}

// The draft policy's knobs through the public API: refused out of range, counted in the stats.
TEST(SpeculativeEngineTest, ConfidenceThresholdThroughThePublicApi) {
  EngineOptions o = ApiOptions("deepseek_v4");
  o.speculative_min_confidence = 2.0;
  auto refused = Engine::Create(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("speculative_min_confidence"), std::string::npos)
      << refused.status().message();
  o.speculative_min_confidence = 1.0;  // above every random guess: nothing is proposed
  o.speculative_min_acceptance = 0.5;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EngineStatsSnapshot stats;
  EXPECT_EQ(GenerateEight(**engine, stats), 8u);
  EXPECT_EQ(stats.draft_tokens, 0);
  EXPECT_GT(stats.low_confidence_drafts, 0);
}

}  // namespace
}  // namespace dinfer
