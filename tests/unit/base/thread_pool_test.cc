#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "base/status.h"

namespace dinfer {
namespace {

TEST(ThreadPool, EveryTaskRunsOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 3, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.ParallelFor(n, [&](int t, int64_t i) {
        EXPECT_GE(t, 0);
        EXPECT_LT(t, threads);
        hits[i].fetch_add(1);
      });
      for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPool, RangesCoverExactly) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 3, 10, 1001}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.ParallelRanges(n, [&](int, int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, ManyShortLoops) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 20000; ++rep) pool.ParallelFor(4, [&](int, int64_t i) { sum += i; });
  EXPECT_EQ(sum.load(), 20000 * 6);
}

TEST(Status, CodesAndContext) {
  Status s = NotFound("no file '{}'", "x.gguf");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "NOT_FOUND: no file 'x.gguf'");
  EXPECT_EQ(s.WithContext("loading").message(), "loading: no file 'x.gguf'");
  EXPECT_TRUE(OkStatus().ok());
  StatusOr<int> v = 3;
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 3);
  StatusOr<int> e = InvalidArgument("bad");
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dinfer
