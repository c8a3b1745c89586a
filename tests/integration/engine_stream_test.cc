// The public Engine's streams read without blocking: TryNext and the ready callback that
// event-driven servers use instead of a thread per stream.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "dinfer/engine.h"

namespace dinfer {
namespace {

std::unique_ptr<Engine> TinyEngine() {
  EngineOptions o;
  o.model = std::string(DINFER_SOURCE_DIR) + "/tests/data/models/llama";
  o.threads = 1;
  o.kv_cache_mib = 16;
  o.show_progress = false;
  auto engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return std::move(engine).value();
}

RequestSpec Spec(int n, int64_t max_tokens) {
  RequestSpec spec;
  spec.prompt_ids = {1, 2, 3, 4, 5};
  spec.sampling.temperature = 0;
  spec.sampling.max_tokens = max_tokens;
  spec.sampling.ignore_eos = true;
  spec.sampling.n = n;
  return spec;
}

TEST(EngineStream, ReadyCallbackAndTryNextDeliverEveryOutput) {
  auto engine = TinyEngine();
  auto blocking = engine->Submit(Spec(2, 6));
  ASSERT_TRUE(blocking.ok());
  std::vector<int32_t> expected[2];
  while (auto out = (*blocking)->Next()) {
    expected[out->index].insert(expected[out->index].end(), out->token_ids.begin(),
                                out->token_ids.end());
  }

  auto stream = engine->Submit(Spec(2, 6));
  ASSERT_TRUE(stream.ok());
  std::mutex mu;
  std::condition_variable cv;
  int signals = 0;
  (*stream)->SetReadyCallback([&] {
    std::lock_guard<std::mutex> lock(mu);
    ++signals;
    cv.notify_all();
  });
  std::vector<int32_t> got[2];
  int finished = 0;
  while (finished < 2) {
    {
      std::unique_lock<std::mutex> lock(mu);
      ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return signals > 0; }));
      signals = 0;
    }
    while (auto out = (*stream)->TryNext()) {
      got[out->index].insert(got[out->index].end(), out->token_ids.begin(), out->token_ids.end());
      finished += out->finished ? 1 : 0;
    }
  }
  EXPECT_EQ(got[0], expected[0]);
  EXPECT_EQ(got[1], expected[1]);
  EXPECT_EQ(got[0].size(), 6u);
  EXPECT_FALSE((*stream)->TryNext().has_value());
}

TEST(EngineStream, CallbackSetLateFiresForQueuedOutputs) {
  auto engine = TinyEngine();
  auto stream = engine->Submit(Spec(1, 2));
  ASSERT_TRUE(stream.ok());
  // Let the request finish before anyone listens.
  while (engine->Stats().running + engine->Stats().waiting > 0 || engine->Stats().steps == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::atomic<int> calls{0};
  (*stream)->SetReadyCallback([&] { ++calls; });
  EXPECT_GE(calls.load(), 1);
  int tokens = 0;
  bool finished = false;
  while (auto out = (*stream)->TryNext()) {
    tokens += static_cast<int>(out->token_ids.size());
    finished |= out->finished;
  }
  EXPECT_EQ(tokens, 2);
  EXPECT_TRUE(finished);
}

}  // namespace
}  // namespace dinfer
