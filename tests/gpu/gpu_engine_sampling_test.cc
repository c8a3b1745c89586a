// The engine sampling on the GPU: requests with temperature, top-p, top-k, penalties, logit bias
// and a JSON Schema constraint (a byte vocabulary over the tiny Llama's 256 tokens) produce valid
// constrained output, and the same tokens for the same seed whatever the batch around them,
// with asynchronous or synchronous scheduling; the device sampling matches the host's.
#include <map>
#include <random>

#include <boost/json.hpp>

#include "engine/engine_core.h"
#include "gpu_test_util.h"
#include "model/loader.h"
#include "structured/compiler.h"
#include "structured/constraint.h"
#include "structured/matcher.h"

namespace dinfer {
namespace {

constexpr char kSchema[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 8},
    "n": {"type": "integer", "minimum": 0, "maximum": 999},
    "ok": {"type": "boolean"}
  },
  "required": ["name", "n", "ok"],
  "additionalProperties": false
})";

constexpr int32_t kStop = 0;  // token 0 ends the output; token i >= 1 is the byte i

std::shared_ptr<const structured::CompiledGrammar> Grammar() {
  std::vector<std::string> tokens;
  tokens.emplace_back("");
  for (int b = 1; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  static const structured::GrammarCompiler compiler(
      structured::TokenIndex::FromTokens(std::move(tokens), {kStop}));
  structured::Constraint c;
  c.kind = structured::ConstraintKind::kJsonSchema;
  c.text = kSchema;
  auto g = structured::BuildGrammar(c);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  auto compiled = compiler.Compile(*g);
  EXPECT_TRUE(compiled.ok()) << compiled.status().ToString();
  return *compiled;
}

std::vector<int32_t> Prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(1 + rng() % 255);
  return p;
}

RequestOptions Options(int i, const std::shared_ptr<const structured::CompiledGrammar>& g) {
  RequestOptions o;
  o.max_tokens = 110 + 3 * i;
  o.has_seed = true;
  o.sampling.seed = 1000 + i;
  o.sampling.temperature = 0.6 + 0.2 * (i % 3);
  o.sampling.top_p = i % 2 == 0 ? 0.9 : 1.0;
  o.sampling.top_k = i % 3 == 1 ? 40 : 0;
  o.sampling.min_p = i % 4 == 3 ? 0.05 : 0.0;
  o.sampling.presence_penalty = 0.4;
  o.sampling.frequency_penalty = 0.2;
  o.sampling.repetition_penalty = 1.1;
  o.sampling.logit_bias = {{'"', 1.5f}, {'7', -2.0f}};
  o.sampling.logprobs = i % 2 == 0 ? 3 : -1;
  o.stop_token_ids = {kStop};
  if (i % 3 != 2) o.grammar = g;
  return o;
}

struct Output {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  std::vector<sample::SampleResult> logprobs;
};

// Serves the requests `ids` (submitted two per step) and, with `noise`, unrelated requests that
// change the batches around them.
std::map<int64_t, Output> Serve(EngineCore& core, const std::vector<int>& ids, bool noise,
                                const std::shared_ptr<const structured::CompiledGrammar>& g) {
  std::map<int64_t, Output> out;
  size_t next = 0;
  int noise_id = 1000;
  for (int step = 0; next < ids.size() || core.HasWork(); ++step) {
    for (int k = 0; k < 2 && next < ids.size(); ++k, ++next) {
      const int i = ids[next];
      EXPECT_TRUE(core.AddRequest(i, Prompt(5 + 7 * i, i), Options(i, g)).ok());
    }
    if (noise && step % 3 == 0 && step < 30) {
      RequestOptions o = Options(noise_id, g);
      o.sampling.seed = static_cast<uint64_t>(step);
      o.max_tokens = 30;
      EXPECT_TRUE(core.AddRequest(noise_id, Prompt(3 + step, noise_id), o).ok());
      ++noise_id;
    }
    for (const TokenDelta& d : core.Step()) {
      EXPECT_TRUE(d.error.empty()) << d.error;
      if (d.request_id >= 1000) continue;
      Output& o = out[d.request_id];
      o.tokens.insert(o.tokens.end(), d.tokens.begin(), d.tokens.end());
      o.logprobs.insert(o.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      if (d.finish != FinishReason::kNone) o.finish = d.finish;
    }
    if (step > 5000) break;
  }
  return out;
}

TEST(GpuEngineSampling, ConstrainedAndDeterministic) {
  SKIP_WITHOUT_GPU();
  auto lm = LoadModel(std::string(DINFER_SOURCE_DIR) + "/tests/data/models/llama",
                      LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  const auto grammar = Grammar();
  ASSERT_NE(grammar, nullptr);
  EngineConfig cfg;
  cfg.threads = 2;
  cfg.num_kv_blocks = 256;
  cfg.scheduler.max_num_batched_tokens = 64;
  cfg.scheduler.max_model_len = 256;
  cfg.device = Device::kCuda;
  cfg.cuda_dtype = DType::kF32;
  const std::vector<int> ids = {0, 1, 2, 3, 4, 5, 6, 7};

  EngineCore gpu(*lm->model, cfg);
  ASSERT_TRUE(gpu.runner().SupportsDeviceSampling()) << gpu.runner().status().ToString();
  const auto want = Serve(gpu, ids, false, grammar);
  ASSERT_EQ(want.size(), ids.size());
  for (const auto& [id, o] : want) {
    const RequestOptions opt = Options(static_cast<int>(id), grammar);
    EXPECT_FALSE(o.tokens.empty()) << id;
    EXPECT_EQ(o.logprobs.size(), opt.sampling.logprobs >= 0 ? o.tokens.size() : 0u) << id;
    if (!opt.grammar) continue;
    // Every token is allowed, and the output ends complete: valid JSON of the schema.
    structured::Matcher m(grammar);
    std::string text;
    for (int32_t t : o.tokens) {
      ASSERT_TRUE(m.AcceptToken(t)) << "request " << id << " token " << t << " after " << text;
      if (t != kStop) text.push_back(static_cast<char>(t));
    }
    EXPECT_TRUE(m.IsCompleted() || m.IsTerminated()) << id << ": " << text;
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(text, ec);
    ASSERT_FALSE(ec) << id << ": " << text;
    ASSERT_TRUE(v.is_object()) << text;
    EXPECT_TRUE(v.as_object().contains("name") && v.as_object().contains("n") &&
                v.as_object().contains("ok"))
        << text;
  }

  // Other batch compositions, synchronous scheduling, a fresh engine: the same tokens.
  EngineCore mixed(*lm->model, cfg);
  const auto got_mixed = Serve(mixed, {7, 3, 5, 1, 0, 2, 4, 6}, true, grammar);
  cfg.async_scheduling = false;
  EngineCore sync(*lm->model, cfg);
  const auto got_sync = Serve(sync, ids, false, grammar);
  for (const auto& [id, o] : want) {
    EXPECT_EQ(got_mixed.at(id).tokens, o.tokens) << "request " << id;
    EXPECT_EQ(got_sync.at(id).tokens, o.tokens) << "request " << id;
  }

  // The host sampler on the same logits (f32 weights) draws the same tokens.
  cfg.device_sampling = false;
  cfg.async_scheduling = true;
  EngineCore host(*lm->model, cfg);
  const auto got_host = Serve(host, ids, false, grammar);
  int same = 0;
  for (const auto& [id, o] : want) same += got_host.at(id).tokens == o.tokens;
  EXPECT_GE(same, static_cast<int>(ids.size()) - 1);
}

}  // namespace
}  // namespace dinfer
