#include "kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <string>
#include <vector>

#include "kv_table_test_util.h"

namespace dinfer::kv {
namespace {

using testing::Concat;
using testing::kAny;
using testing::kRefused;
using testing::Op;
using testing::Req;
using testing::Row;
using testing::Seq;
using testing::TableRunner;

KvCacheSpec Spec(int64_t num_blocks, int64_t block_size, int64_t sliding_window = 0,
                 bool prefix_caching = true) {
  KvCacheSpec spec;
  spec.num_blocks = num_blocks;
  spec.block_size = block_size;
  spec.sliding_window = sliding_window;
  spec.enable_prefix_caching = prefix_caching;
  return spec;
}

TEST(KvCacheManager, FreshManagerIsAllFree) {
  KvCacheManager kv(Spec(8, 4));
  const KvCacheStats s = kv.Stats();
  EXPECT_EQ(s.total, 7);
  EXPECT_EQ(s.free, 7);
  EXPECT_EQ(s.cached, 0);
  EXPECT_EQ(s.in_use, 0);
  EXPECT_EQ(kv.Usage(), 0.0);
  EXPECT_TRUE(kv.CheckInvariants().ok());
  EXPECT_TRUE(kv.BlockTable(1).empty());
  EXPECT_EQ(kv.NumCachedTokens(1), 0);
}

// Growth only takes a block when the tokens cross a block boundary; a smaller total is a no-op.
TEST(KvCacheManager, GrowthAcrossBlockBoundaries) {
  TableRunner t(Spec(6, 4), {{.id = 1, .tokens = Seq(100, 20), .prompt_len = 20}});
  t.Run({
      {Op::kAllocate, 1, 1, 0, {4, 0, 1}, {{1, {1}}}},
      {Op::kAllocate, 1, 4, 0, {4, 0, 1}, {{1, {1}}}},
      {Op::kAllocate, 1, 5, 0, {3, 0, 2}, {{1, {1, 2}}}},
      {Op::kAllocate, 1, 12, 0, {2, 0, 3}, {{1, {1, 2, 3}}}},
      {Op::kAllocate, 1, 13, 0, {1, 0, 4}, {{1, {1, 2, 3, 4}}}},
      {Op::kAllocate, 1, 8, 0, {1, 0, 4}, {{1, {1, 2, 3, 4}}}},
      // Nothing was committed: every block goes back to the free list.
      {Op::kFree, 1, 0, kAny, {5, 0, 0}, {{1, {}}}},
      // The free list is a stack, and Free pushed the last block first: block 1 comes back first.
      {Op::kAllocate, 1, 3, 0, {4, 0, 1}, {{1, {1}}}},
  });
  EXPECT_DOUBLE_EQ(t.kv().Usage(), 1.0 / 5.0);
}

// A refused Allocate, first or growing, changes nothing (the runner compares snapshots).
TEST(KvCacheManager, ExhaustionChangesNothing) {
  TableRunner t(Spec(5, 4), {{.id = 1, .tokens = Seq(0, 9), .prompt_len = 8},
                             {.id = 2, .tokens = Seq(50, 12), .prompt_len = 12}});
  t.Run({
      {Op::kAllocate, 1, 8, 0, {2, 0, 2}, {{1, {1, 2}}}},
      {Op::kAllocate, 2, 12, kRefused, {2, 0, 2}, {{1, {1, 2}}, {2, {}}}},
      {Op::kAllocate, 2, 8, 0, {0, 0, 4}, {{2, {3, 4}}}},
      {Op::kAllocate, 1, 9, kRefused, {0, 0, 4}, {{1, {1, 2}}, {2, {3, 4}}}},
      {Op::kFree, 2, 0, kAny, {2, 0, 2}, {{2, {}}}},
      {Op::kAllocate, 1, 9, 0, {1, 0, 3}, {{1, {1, 2, 3}}}},
  });
  EXPECT_FALSE(t.kv().CanAllocate(3, 5));
  EXPECT_EQ(t.kv().BlocksNeeded(3, 5), 2);
  EXPECT_EQ(t.kv().BlocksNeeded(1, 12), 0);
  EXPECT_EQ(t.kv().BlocksNeeded(1, 13), 1);
}

// Committed full blocks survive Free as cached blocks and serve the next identical prompt.
TEST(KvCacheManager, PrefixHitAfterFree) {
  const auto tokens = Seq(0, 10);
  TableRunner t(Spec(9, 4), {{.id = 1, .tokens = tokens, .prompt_len = 10},
                             {.id = 2, .tokens = tokens, .prompt_len = 10}});
  t.Run({
      {Op::kMatch, 1, 0, 0, {8, 0, 0}},
      {Op::kAllocate, 1, 10, 0, {5, 0, 3}, {{1, {1, 2, 3}}}},
      {Op::kCommit, 1, 10, kAny, {5, 0, 3}},
      // Blocks 1 and 2 are full and committed: cached. Block 3 holds 2 tokens: free.
      {Op::kFree, 1, 0, kAny, {6, 2, 0}, {{1, {}}}},
      {Op::kMatch, 2, 0, 8, {6, 2, 0}},
      {Op::kAllocate, 2, 10, 8, {5, 0, 3}, {{2, {1, 2, 3}}}},
  });
  const KvCacheStats s = t.kv().Stats();
  EXPECT_EQ(s.prefix_queries, 20);
  EXPECT_EQ(s.prefix_hits, 8);
}

// A waiting request is matched again at every step it stays blocked; only its admission counts.
TEST(KvCacheManager, PrefixStatsCountAdmissionsNotLookups) {
  const auto tokens = Seq(0, 10);
  TableRunner t(Spec(9, 4), {{.id = 1, .tokens = tokens, .prompt_len = 10}});
  t.Run({
      {Op::kMatch, 1, 0, 0, {8, 0, 0}},
      {Op::kMatch, 1, 0, 0, {8, 0, 0}},
      {Op::kMatch, 1, 0, 0, {8, 0, 0}},
  });
  EXPECT_EQ(t.kv().Stats().prefix_queries, 0);
  t.Run({{Op::kAllocate, 1, 10, 0, {5, 0, 3}, {{1, {1, 2, 3}}}}});
  EXPECT_EQ(t.kv().Stats().prefix_queries, 10);
  EXPECT_EQ(t.kv().Stats().prefix_hits, 0);
}

// A tight pool evicts cached blocks least recently freed first; Free releases the tail first, so a
// request's prefix head outlives its tail.
TEST(KvCacheManager, LruEvictsTailBlocksFirst) {
  const auto a = Seq(0, 9);
  TableRunner t(Spec(5, 4), {{.id = 1, .tokens = a, .prompt_len = 9},
                             {.id = 2, .tokens = Seq(100, 9), .prompt_len = 9},
                             {.id = 3, .tokens = a, .prompt_len = 9}});
  t.Run({
      {Op::kAllocate, 1, 9, 0, {1, 0, 3}, {{1, {1, 2, 3}}}},
      {Op::kCommit, 1, 9, kAny, {1, 0, 3}},
      {Op::kFree, 1, 0, kAny, {2, 2, 0}},  // LRU: 2, then 1
      // Takes the free blocks 3 and 4, then evicts block 2 (request 1's tail).
      {Op::kAllocate, 2, 9, 0, {0, 1, 3}, {{2, {3, 4, 2}}}},
      {Op::kMatch, 3, 0, 4, {0, 1, 3}},
      // Reusing block 1 takes it out of the cached pool too: 1 + 2 new > 1 available.
      {Op::kAllocate, 3, 9, kRefused, {0, 1, 3}, {{3, {}}}},
      {Op::kFree, 2, 0, kAny, {3, 1, 0}},
      {Op::kAllocate, 3, 9, 4, {1, 0, 3}, {{3, {1, 3, 4}}}},
  });
}

// Between Match and Allocate a block may be evicted: Allocate reuses fewer blocks and says so.
TEST(KvCacheManager, StaleMatchReusesFewerBlocks) {
  const auto a = Seq(0, 9);
  TableRunner t(Spec(9, 4), {{.id = 1, .tokens = a, .prompt_len = 9},
                             {.id = 2, .tokens = Seq(100, 25), .prompt_len = 25},
                             {.id = 3, .tokens = a, .prompt_len = 9}});
  t.Run({
      {Op::kAllocate, 1, 9, 0, {5, 0, 3}, {{1, {1, 2, 3}}}},
      {Op::kCommit, 1, 9, kAny, {5, 0, 3}},
      {Op::kFree, 1, 0, kAny, {6, 2, 0}},
      {Op::kMatch, 3, 0, 8, {6, 2, 0}},
      // Seven blocks: the six free ones, then block 2 evicted.
      {Op::kAllocate, 2, 25, 0, {0, 1, 7}, {{2, {3, 4, 5, 6, 7, 8, 2}}}},
      {Op::kFree, 2, 0, kAny, {7, 1, 0}},
      // Matched 8 tokens, but only block 1 is still cached: 4 tokens reused.
      {Op::kAllocate, 3, 9, 4, {5, 0, 3}, {{3, {1, 3, 4}}}},
  });
}

// The same tokens under different salts never share blocks.
TEST(KvCacheManager, SaltsIsolateTenants) {
  const auto a = Seq(0, 9);
  TableRunner t(Spec(9, 4), {{.id = 1, .tokens = a, .prompt_len = 9, .salt = 1},
                             {.id = 2, .tokens = a, .prompt_len = 9, .salt = 2},
                             {.id = 3, .tokens = a, .prompt_len = 9, .salt = 1}});
  t.Run({
      {Op::kAllocate, 1, 9, 0, {5, 0, 3}, {{1, {1, 2, 3}}}},
      {Op::kCommit, 1, 9, kAny, {5, 0, 3}},
      {Op::kMatch, 2, 0, 0, {5, 0, 3}},
      {Op::kAllocate, 2, 9, 0, {2, 0, 6}, {{2, {4, 5, 6}}}},
      {Op::kCommit, 2, 9, kAny, {2, 0, 6}},
      {Op::kMatch, 3, 0, 8, {2, 0, 6}},
      {Op::kAllocate, 3, 9, 8, {1, 0, 7}, {{3, {1, 2, 7}}}},
      {Op::kFree, 1, 0, kAny, {2, 0, 6}},
      {Op::kFree, 3, 0, kAny, {3, 2, 3}},
      {Op::kFree, 2, 0, kAny, {4, 4, 0}},
  });
}

// Only full, computed blocks are committed: a decode fills the last block and then it is cached.
TEST(KvCacheManager, PartialLastBlockNeverCached) {
  const auto a = Seq(0, 14);
  TableRunner t(Spec(9, 4), {{.id = 1, .tokens = a, .prompt_len = 10},
                             {.id = 2, .tokens = a, .prompt_len = 13},
                             {.id = 3, .tokens = a, .prompt_len = 14}});
  t.Run({
      {Op::kAllocate, 1, 10, 0, {5, 0, 3}, {{1, {1, 2, 3}}}},
      {Op::kCommit, 1, 10, kAny, {5, 0, 3}},
      {Op::kMatch, 2, 0, 8, {5, 0, 3}},
      // Decode steps: 11, 12 tokens (block 3 now full), 13 (a new block).
      {Op::kAllocate, 1, 11, 0, {5, 0, 3}},
      {Op::kCommit, 1, 11, kAny, {5, 0, 3}},
      {Op::kMatch, 2, 0, 8, {5, 0, 3}},
      {Op::kAllocate, 1, 12, 0, {5, 0, 3}},
      {Op::kCommit, 1, 12, kAny, {5, 0, 3}},
      {Op::kMatch, 2, 0, 12, {5, 0, 3}},
      {Op::kAllocate, 1, 13, 0, {4, 0, 4}, {{1, {1, 2, 3, 4}}}},
      {Op::kCommit, 1, 13, kAny, {4, 0, 4}},
      // Block 4 holds one token: freed, not cached.
      {Op::kFree, 1, 0, kAny, {5, 3, 0}},
      {Op::kMatch, 3, 0, 12, {5, 3, 0}},
      {Op::kAllocate, 3, 14, 12, {4, 0, 4}, {{3, {1, 2, 3, 4}}}},
  });
}

// A fully cached prompt still computes its last token, so its last block is recomputed into a
// private duplicate, which the index does not take over and which is freed normally.
TEST(KvCacheManager, MatchLeavesOneTokenAndDuplicatesStayPrivate) {
  const auto a = Seq(0, 8);
  TableRunner t(Spec(9, 4),
                {{.id = 1, .tokens = a, .prompt_len = 8}, {.id = 2, .tokens = a, .prompt_len = 8}});
  t.Run({
      {Op::kAllocate, 1, 8, 0, {6, 0, 2}, {{1, {1, 2}}}},
      {Op::kCommit, 1, 8, kAny, {6, 0, 2}},
      {Op::kFree, 1, 0, kAny, {6, 2, 0}},
      {Op::kMatch, 2, 0, 4, {6, 2, 0}},
      {Op::kAllocate, 2, 8, 4, {5, 1, 2}, {{2, {1, 3}}}},
      {Op::kCommit, 2, 8, kAny, {5, 1, 2}},
      // Block 3 duplicates block 2's hash: it goes back to the free list, not the cache.
      {Op::kFree, 2, 0, kAny, {6, 2, 0}},
      {Op::kMatch, 2, 0, 4, {6, 2, 0}},
  });
  EXPECT_EQ(t.kv().Match(Seq(0, 9), 0).num_cached_tokens, 8);
  EXPECT_EQ(t.kv().Match(Seq(0, 1), 0).num_cached_tokens, 0);
  EXPECT_EQ(t.kv().Match({}, 0).num_cached_tokens, 0);
}

// Two running requests share a committed prefix: the shared blocks count once in in_use and stay
// in use until both are freed.
TEST(KvCacheManager, TwoRequestsShareAPrefix) {
  const auto a = Seq(0, 9);
  const auto b = Concat(Seq(0, 8), Seq(500, 2));
  TableRunner t(Spec(9, 4), {{.id = 1, .tokens = a, .prompt_len = 9},
                             {.id = 2, .tokens = b, .prompt_len = 10}});
  t.Run({
      {Op::kAllocate, 1, 9, 0, {5, 0, 3}, {{1, {1, 2, 3}}}},
      {Op::kCommit, 1, 9, kAny, {5, 0, 3}},
      {Op::kMatch, 2, 0, 8, {5, 0, 3}},
      {Op::kAllocate, 2, 10, 8, {4, 0, 4}, {{1, {1, 2, 3}}, {2, {1, 2, 4}}}},
      {Op::kCommit, 2, 10, kAny, {4, 0, 4}},
      {Op::kFree, 1, 0, kAny, {5, 0, 3}, {{1, {}}, {2, {1, 2, 4}}}},
      {Op::kFree, 2, 0, kAny, {6, 2, 0}, {{2, {}}}},
  });
}

// n > 1 sampling: the second sequence is admitted after the first computed the prompt, shares its
// full blocks, then both decode into blocks of their own.
TEST(KvCacheManager, ParallelSamplingSharesThePrompt) {
  const auto prompt = Seq(0, 10);
  TableRunner t(Spec(9, 4), {{.id = 1, .tokens = Concat(prompt, Seq(200, 6)), .prompt_len = 10},
                             {.id = 2, .tokens = Concat(prompt, Seq(300, 6)), .prompt_len = 10}});
  t.Run({
      {Op::kMatch, 1, 0, 0, {8, 0, 0}},
      {Op::kAllocate, 1, 10, 0, {5, 0, 3}, {{1, {1, 2, 3}}}},
      {Op::kCommit, 1, 10, kAny, {5, 0, 3}},
      {Op::kMatch, 2, 0, 8, {5, 0, 3}},
      {Op::kAllocate, 2, 10, 8, {4, 0, 4}, {{2, {1, 2, 4}}}},
      {Op::kCommit, 2, 10, kAny, {4, 0, 4}},
      // Each decodes to 13 tokens: blocks 3 and 4 fill with different tokens, each gets another.
      {Op::kAllocate, 1, 13, 0, {3, 0, 5}, {{1, {1, 2, 3, 5}}}},
      {Op::kCommit, 1, 13, kAny, {3, 0, 5}},
      {Op::kAllocate, 2, 13, 8, {2, 0, 6}, {{2, {1, 2, 4, 6}}}},
      {Op::kCommit, 2, 13, kAny, {2, 0, 6}},
      {Op::kFree, 1, 0, kAny, {3, 1, 4}},
      {Op::kFree, 2, 0, kAny, {4, 4, 0}},
  });
  // Both continuations are cached under their own third block.
  EXPECT_EQ(t.kv().Match(Concat(prompt, Seq(200, 3)), 0).num_cached_tokens, 12);
  EXPECT_EQ(t.kv().Match(Concat(prompt, Seq(300, 3)), 0).num_cached_tokens, 12);
}

// Window 8, blocks of 4: after computing up to position p - 1, keys <= p - 8 are dead.
TEST(KvCacheManager, SlidingWindowReleasesDeadBlocks) {
  const auto a = Seq(0, 30);
  TableRunner t(Spec(9, 4, /*sliding_window=*/8), {{.id = 1, .tokens = a, .prompt_len = 6},
                                                   {.id = 2, .tokens = a, .prompt_len = 17}});
  t.Run({
      {Op::kAllocate, 1, 6, 0, {6, 0, 2}, {{1, {1, 2}}}},
      {Op::kCommit, 1, 6, kAny, {6, 0, 2}},
      {Op::kRelease, 1, 6, kAny, {6, 0, 2}, {{1, {1, 2}}}},
      {Op::kAllocate, 1, 13, 0, {4, 0, 4}, {{1, {1, 2, 3, 4}}}},
      {Op::kCommit, 1, 13, kAny, {4, 0, 4}},
      // Position 13 sees 6..13: block 0 (0..3) is dead, block 1 (4..7) is not.
      {Op::kRelease, 1, 13, kAny, {4, 1, 3}, {{1, {0, 2, 3, 4}}}},
      {Op::kRelease, 1, 13, kAny, {4, 1, 3}, {{1, {0, 2, 3, 4}}}},
      {Op::kAllocate, 1, 17, 0, {3, 1, 4}, {{1, {0, 2, 3, 4, 5}}}},
      {Op::kCommit, 1, 17, kAny, {3, 1, 4}},
      {Op::kRelease, 1, 17, kAny, {3, 2, 3}, {{1, {0, 0, 3, 4, 5}}}},
      // Block 5 holds one token (free); blocks 3 and 4 are committed (cached).
      {Op::kFree, 1, 0, kAny, {4, 4, 0}, {{1, {}}}},
      // The prefix hits; the window only needs blocks 2 and 3 (positions 9.. are read from 16 on),
      // so blocks 0 and 1 stay cached and their slots are released at once.
      {Op::kMatch, 2, 0, 16, {4, 4, 0}},
      {Op::kAllocate, 2, 17, 16, {3, 2, 3}, {{2, {0, 0, 3, 4, 5}}}},
      {Op::kRelease, 2, 16, kAny, {3, 2, 3}, {{2, {0, 0, 3, 4, 5}}}},
      {Op::kFree, 2, 0, kAny, {4, 4, 0}},
  });
}

// A block released before it was committed loses its KV: it is freed, not published, but the
// chain goes on: the blocks after it hold their own keys, and a window hit needs only those.
TEST(KvCacheManager, SlidingWindowReleaseBeforeCommitSkipsTheBlock) {
  const auto a = Seq(0, 21);
  const auto b = Concat(Seq(0, 8), Seq(100, 13));  // shares blocks 0 and 1 only
  TableRunner t(Spec(9, 4, /*sliding_window=*/8), {{.id = 1, .tokens = a, .prompt_len = 20},
                                                   {.id = 2, .tokens = a, .prompt_len = 21},
                                                   {.id = 3, .tokens = b, .prompt_len = 21}});
  t.Run({
      {Op::kAllocate, 1, 20, 0, {3, 0, 5}, {{1, {1, 2, 3, 4, 5}}}},
      {Op::kRelease, 1, 20, kAny, {6, 0, 2}, {{1, {0, 0, 0, 4, 5}}}},
      {Op::kCommit, 1, 20, kAny, {6, 0, 2}},
      {Op::kFree, 1, 0, kAny, {6, 2, 0}},
      {Op::kMatch, 2, 0, 20, {6, 2, 0}},
      {Op::kAllocate, 2, 21, 20, {5, 0, 3}, {{2, {0, 0, 0, 4, 5, 1}}}},
      {Op::kMatch, 3, 0, 0, {5, 0, 3}},
  });
}

TEST(KvCacheManager, ReleaseIsANoOpForFullAttention) {
  TableRunner t(Spec(9, 4), {{.id = 1, .tokens = Seq(0, 20), .prompt_len = 20}});
  t.Run({
      {Op::kAllocate, 1, 20, 0, {3, 0, 5}},
      {Op::kRelease, 1, 20, kAny, {3, 0, 5}, {{1, {1, 2, 3, 4, 5}}}},
  });
}

TEST(KvCacheManager, PrefixCachingDisabled) {
  const auto a = Seq(0, 9);
  TableRunner t(Spec(9, 4, 0, /*prefix_caching=*/false),
                {{.id = 1, .tokens = a, .prompt_len = 9}, {.id = 2, .tokens = a, .prompt_len = 9}});
  t.Run({
      {Op::kAllocate, 1, 9, 0, {5, 0, 3}},
      {Op::kCommit, 1, 9, kAny, {5, 0, 3}},
      {Op::kFree, 1, 0, kAny, {8, 0, 0}},
      {Op::kMatch, 2, 0, 0, {8, 0, 0}},
  });
  EXPECT_EQ(t.kv().Stats().prefix_queries, 0);
}

TEST(KvCacheManager, UnknownRequestsAreNoOps) {
  KvCacheManager kv(Spec(5, 4, 8));
  const auto tokens = Seq(0, 8);
  kv.Free(42);
  kv.CommitComputed(42, tokens, 8);
  kv.ReleaseOutsideWindow(42, 100);
  EXPECT_TRUE(kv.BlockTable(42).empty());
  EXPECT_EQ(kv.NumCachedTokens(42), 0);
  EXPECT_EQ(kv.Stats().free, 4);
  EXPECT_TRUE(kv.CheckInvariants().ok());
}

// BlocksNeeded counts reused blocks that are cached now (they leave the cached pool); with the
// prompt it is exact, without it assumes the matched blocks are held elsewhere.
TEST(KvCacheManager, BlocksNeededCountsCachedReuse) {
  KvCacheManager kv(Spec(5, 4));
  const auto a = Seq(0, 9);
  ASSERT_TRUE(kv.Allocate(1, 9, a));
  kv.CommitComputed(1, a, 9);
  kv.Free(1);  // blocks 1, 2 cached; 3, 4 free
  ASSERT_EQ(kv.Match(a, 0).num_cached_tokens, 8);
  EXPECT_EQ(kv.BlocksNeeded(2, 9, 8, a, 0), 3);
  EXPECT_EQ(kv.BlocksNeeded(2, 9, 8), 1);
  EXPECT_EQ(kv.BlocksNeeded(2, 9, 8, Seq(100, 9), 0), 3);  // a different prompt: no reuse
  EXPECT_EQ(kv.BlocksNeeded(2, 9), 3);
  EXPECT_TRUE(kv.CanAllocate(2, 9, 8, a, 0));

  // While request 3 holds the prefix, request 2 reuses it without touching the pools.
  ASSERT_TRUE(kv.Allocate(3, 9, a, 0, 8));
  EXPECT_EQ(kv.BlocksNeeded(2, 9, 8, a, 0), 1);
  EXPECT_TRUE(kv.CanAllocate(2, 9, 8, a, 0));
  EXPECT_FALSE(kv.CanAllocate(2, 13, 8, a, 0));
  EXPECT_FALSE(kv.Allocate(2, 13, a, 0, 8));
  ASSERT_TRUE(kv.Allocate(2, 9, a, 0, 8));
  EXPECT_EQ(kv.NumCachedTokens(2), 8);
  EXPECT_TRUE(kv.CheckInvariants().ok());
}

// Reuse is capped like Match and by total_tokens, even when the caller asks for more.
TEST(KvCacheManager, AllocateCapsReuse) {
  KvCacheManager kv(Spec(16, 4));
  const auto a = Seq(0, 12);
  ASSERT_TRUE(kv.Allocate(1, 12, a));
  kv.CommitComputed(1, a, 12);
  ASSERT_TRUE(kv.Allocate(2, 12, a, 0, 12));
  EXPECT_EQ(kv.NumCachedTokens(2), 8);  // one token left to compute
  ASSERT_TRUE(kv.Allocate(3, 5, a, 0, 8));
  EXPECT_EQ(kv.NumCachedTokens(3), 4);  // at most total_tokens
  ASSERT_TRUE(kv.Allocate(4, 12, a, 0, 6));
  EXPECT_EQ(kv.NumCachedTokens(4), 4);  // whole blocks only
  ASSERT_TRUE(kv.Allocate(5, 12, {}, 0, 8));
  EXPECT_EQ(kv.NumCachedTokens(5), 0);  // nothing to re-check against
  // Zero tokens take nothing and leave the request unknown, free to reuse on its next call.
  ASSERT_TRUE(kv.Allocate(6, 0, a, 0, 8));
  EXPECT_TRUE(kv.BlockTable(6).empty());
  ASSERT_TRUE(kv.Allocate(6, 12, a, 0, 8));
  EXPECT_EQ(kv.NumCachedTokens(6), 8);
  EXPECT_TRUE(kv.CheckInvariants().ok());
}

TEST(KvCacheManager, HashBlockSeparatesInputs) {
  const auto a = Seq(0, 16);
  const auto b = Seq(1, 16);
  const BlockHash h = HashBlock(0, a, 0);
  EXPECT_EQ(h, HashBlock(0, a, 0));
  EXPECT_NE(h, HashBlock(0, b, 0));
  EXPECT_NE(h, HashBlock(1, a, 0));
  EXPECT_NE(h, HashBlock(0, a, 1));
  // Parent and salt are not interchangeable.
  EXPECT_NE(HashBlock(7, a, 0), HashBlock(0, a, 7));
}

// A 4096-token prompt, all cached: Match hashes 255 blocks per call. No timing assertion; this
// keeps an accidental quadratic walk visible in the test's run time.
TEST(KvCacheManager, MatchOnLongPromptIsFast) {
  KvCacheManager kv(Spec(300, 16));
  const auto prompt = Seq(1000, 4096);
  ASSERT_TRUE(kv.Allocate(1, 4096, prompt));
  kv.CommitComputed(1, prompt, 4096);
  const auto start = std::chrono::steady_clock::now();
  int64_t hits = 0;
  constexpr int kCalls = 2000;
  for (int i = 0; i < kCalls; ++i) hits += kv.Match(prompt, 0).num_cached_tokens;
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(hits, int64_t{kCalls} * 4080);
  RecordProperty("match_4096_us", std::to_string(us / kCalls));
  EXPECT_TRUE(kv.CheckInvariants().ok());
}

// DeepSeek-V4's shape in miniature: a window group (blocks of 4, window 8) and compressed groups
// with a row every 2 tokens (blocks of 8: four rows) and every 8 tokens (blocks of 8: one row).
KvCacheSpec ThreeGroups(int64_t num_blocks) {
  KvCacheSpec spec = Spec(num_blocks, 4, /*sliding_window=*/8);
  spec.extra_groups.push_back({num_blocks, 8, 0, 2});
  spec.extra_groups.push_back({num_blocks, 8, 0, 8});
  return spec;
}

std::vector<BlockId> Table(const KvCacheManager& kv, RequestId id, int64_t group) {
  const auto t = kv.BlockTable(id, group);
  return {t.begin(), t.end()};
}

TEST(KvCacheManager, GroupsAllocateBlocksAsTheirRowsNeedThem) {
  KvCacheManager kv(ThreeGroups(9));
  const auto a = Seq(0, 40);
  ASSERT_TRUE(kv.Allocate(1, 7, a, 0, 0));
  // 7 tokens: 2 window blocks, 3 rows of rate 2 (1 block), no row of rate 8 yet.
  EXPECT_EQ(Table(kv, 1, 0).size(), 2u);
  EXPECT_EQ(Table(kv, 1, 1).size(), 1u);
  EXPECT_EQ(Table(kv, 1, 2).size(), 0u);
  ASSERT_TRUE(kv.Allocate(1, 8));
  EXPECT_EQ(Table(kv, 1, 2).size(), 1u);
  EXPECT_EQ(kv.GroupStats(2).in_use, 1);
  EXPECT_TRUE(kv.CheckInvariants().ok());
  // A group that runs out refuses the whole allocation and changes nothing.
  KvCacheSpec small = ThreeGroups(9);
  small.extra_groups[1].num_blocks = 2;  // one block: 8 tokens of rate-8 rows
  KvCacheManager tight(small);
  ASSERT_TRUE(tight.Allocate(1, 15, a, 0, 0));
  EXPECT_FALSE(tight.CanAllocate(1, 16));
  EXPECT_FALSE(tight.Allocate(1, 16));
  EXPECT_EQ(Table(tight, 1, 0).size(), 4u);
  EXPECT_TRUE(tight.CheckCanEverHold(15).ok());
  EXPECT_EQ(tight.CheckCanEverHold(16).message(),
            "needs 2 KV blocks for 16 tokens but the cache holds 1 blocks (KV group 2)");
  EXPECT_TRUE(tight.CheckInvariants().ok());
}

TEST(KvCacheManager, GroupsHitWhereEveryGroupHasThePrefix) {
  KvCacheManager kv(ThreeGroups(17));
  const auto a = Seq(0, 40);
  ASSERT_TRUE(kv.Allocate(1, 24, a, 0, 0));
  kv.CommitComputed(1, a, 24);
  kv.ReleaseOutsideWindow(1, 24);
  // Window blocks 0..3 are behind position 24's window (17..): released, but they stay cached.
  EXPECT_EQ(Table(kv, 1, 0), (std::vector<BlockId>{0, 0, 0, 0, 5, 6}));
  kv.Free(1);
  ASSERT_TRUE(kv.CheckInvariants().ok());
  // The whole prefix: window blocks 4 and 5, rate-2 blocks 0..2, rate-8 blocks 0..2.
  EXPECT_EQ(kv.Match(Seq(0, 30), 0).num_cached_tokens, 24);
  EXPECT_EQ(kv.Match(Seq(0, 25), 0).num_cached_tokens, 24);
  // Tokens 0..19 agree: 20 tokens would end a rate-2 block half way (10 of 12 rows), so 16
  // tokens hit.
  const auto b = Concat(Seq(0, 20), Seq(100, 10));
  EXPECT_EQ(kv.Match(b, 0).num_cached_tokens, 16);
  ASSERT_TRUE(kv.Allocate(2, 30, b, 0, 16));
  EXPECT_EQ(kv.NumCachedTokens(2), 16);
  // From 16 the window reads 9..: window blocks 0 and 1 are not needed.
  const auto w = Table(kv, 2, 0);
  EXPECT_EQ(w[0], kNullBlock);
  EXPECT_EQ(w[1], kNullBlock);
  EXPECT_NE(w[2], kNullBlock);
  EXPECT_EQ(Table(kv, 2, 1).size(), 4u);  // 15 rows of rate 2
  EXPECT_EQ(Table(kv, 2, 2).size(), 3u);
  EXPECT_TRUE(kv.CheckInvariants().ok());
  // Another salt shares nothing.
  EXPECT_EQ(kv.Match(Seq(0, 30), 1).num_cached_tokens, 0);
}

TEST(KvCacheManager, GroupsMissWhenACompressedBlockWasEvicted) {
  KvCacheSpec spec = ThreeGroups(17);
  spec.extra_groups[1].num_blocks = 4;  // three blocks of 8 tokens
  KvCacheManager kv(spec);
  const auto a = Seq(0, 40), c = Seq(200, 40);
  ASSERT_TRUE(kv.Allocate(1, 24, a, 0, 0));
  kv.CommitComputed(1, a, 24);
  kv.Free(1);
  EXPECT_EQ(kv.Match(Seq(0, 30), 0).num_cached_tokens, 24);
  // Another request takes every rate-8 block: the cached ones are evicted.
  ASSERT_TRUE(kv.Allocate(2, 24, c, 0, 0));
  EXPECT_EQ(kv.Match(Seq(0, 30), 0).num_cached_tokens, 0);
  EXPECT_TRUE(kv.CheckInvariants().ok());
}

// A long sequence decoding with a window group: its window blocks stay bounded while the
// compressed groups grow.
TEST(KvCacheManager, WindowBlocksStayBoundedAsASequenceGrows) {
  KvCacheManager kv(ThreeGroups(64));
  std::vector<int32_t> tokens = Seq(0, 200);
  ASSERT_TRUE(kv.Allocate(1, 20, tokens, 0, 0));
  kv.CommitComputed(1, tokens, 20);
  kv.ReleaseOutsideWindow(1, 20);
  int64_t most = 0;
  for (int64_t n = 21; n <= 200; ++n) {
    ASSERT_TRUE(kv.Allocate(1, n)) << n;
    kv.CommitComputed(1, tokens, n);
    kv.ReleaseOutsideWindow(1, n);
    most = std::max(most, kv.GroupStats(0).in_use);
    ASSERT_TRUE(kv.CheckInvariants().ok());
  }
  // Window 8 in blocks of 4: at most 3 blocks (positions n - 7 .. n) are live.
  EXPECT_LE(most, 3);
  EXPECT_EQ(kv.GroupStats(1).in_use, 25);  // 100 rows of rate 2
  EXPECT_EQ(kv.GroupStats(2).in_use, 25);  // 25 rows of rate 8
}

// SWA bounded replay (KvCacheSpec::replay_tokens): the window group (window 8, blocks of 4) holds
// 6 blocks, the compressed groups (rates 2 and 8, blocks of 8 tokens) 10 each.
KvCacheSpec ReplaySpec(int64_t replay_tokens) {
  KvCacheSpec spec = ThreeGroups(11);
  spec.num_blocks = 7;
  spec.replay_tokens = replay_tokens;
  return spec;
}

// Computes `tokens` [from, to) in chunks of 4 as the scheduler does: allocate, commit, release.
void Compute(KvCacheManager& kv, RequestId id, std::span<const int32_t> tokens, int64_t from,
             int64_t to) {
  for (int64_t n = from; n < to;) {
    n = std::min(to, n + 4);
    ASSERT_TRUE(kv.Allocate(id, n)) << n;
    kv.CommitComputed(id, tokens, n);
    kv.ReleaseOutsideWindow(id, n);
    ASSERT_TRUE(kv.CheckInvariants().ok()) << kv.CheckInvariants().ToString();
  }
}

// Request 1 computes the first 40 tokens of `a`; then another request takes every window block,
// evicting the cached ones, while the compressed groups keep the prefix.
void CachePrefixWithoutItsWindow(KvCacheManager& kv, std::span<const int32_t> a) {
  ASSERT_TRUE(kv.Allocate(1, 4, a, 0, 0));
  Compute(kv, 1, a, 4, 40);
  kv.Free(1);
  ASSERT_EQ(kv.GroupStats(0).cached, 6);
  ASSERT_TRUE(kv.Allocate(9, 24, Seq(500, 30), 0, 0));
  ASSERT_EQ(kv.GroupStats(0).cached, 0);
  kv.Free(9);
  ASSERT_EQ(kv.GroupStats(1).cached, 5);
  ASSERT_EQ(kv.GroupStats(2).cached, 5);
}

TEST(KvCacheManager, ReplayHitRebuildsTheMissingWindow) {
  KvCacheManager kv(ReplaySpec(10));
  const auto a = Seq(0, 48);
  CachePrefixWithoutItsWindow(kv, a);
  // Without replay nothing hits: every window block the prefix needs is gone.
  KvCacheSpec plain_spec = ReplaySpec(0);
  KvCacheManager plain(plain_spec);
  CachePrefixWithoutItsWindow(plain, a);
  EXPECT_EQ(plain.Match(a, 0), (PrefixHit{0, 0}));
  // With it, the compressed groups' 40 tokens hit and the window is rebuilt from 40 - 10,
  // rounded down to a window block: 28.
  const PrefixHit hit = kv.Match(a, 0);
  EXPECT_EQ(hit, (PrefixHit{40, 28}));
  EXPECT_EQ(hit.num_replay_tokens(), 12);
  // Fresh window blocks from position 28 on (2 for 28 + 8 tokens); the compressed groups reuse
  // their 5 cached blocks each.
  EXPECT_EQ(kv.BlocksNeeded(2, 36, 40, a, 0, 0), 2);
  EXPECT_EQ(kv.BlocksNeeded(2, 36, 40, a, 0, 1), 5);
  EXPECT_EQ(kv.BlocksNeeded(2, 36, 40, a, 0, 2), 5);
  const KvCacheStats before = kv.Stats();
  ASSERT_TRUE(kv.Allocate(2, 36, a, 0, hit.num_cached_tokens));
  EXPECT_EQ(kv.NumCachedTokens(2), 40);
  EXPECT_EQ(kv.ReplayStart(2), 28);
  const auto w = Table(kv, 2, 0);
  ASSERT_EQ(w.size(), 9u);
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(w[i], kNullBlock) << i;
  EXPECT_NE(w[7], kNullBlock);
  EXPECT_NE(w[8], kNullBlock);
  // The compressed tables hold the hit's 40 tokens although only 36 were asked for.
  EXPECT_EQ(Table(kv, 2, 1).size(), 5u);
  EXPECT_EQ(Table(kv, 2, 2).size(), 5u);
  EXPECT_EQ(kv.GroupStats(1).in_use, 5);
  const KvCacheStats after = kv.Stats();
  EXPECT_EQ(after.prefix_queries - before.prefix_queries, 48);
  EXPECT_EQ(after.prefix_hits - before.prefix_hits, 40);
  EXPECT_EQ(after.prefix_replayed - before.prefix_replayed, 12);
  ASSERT_TRUE(kv.CheckInvariants().ok()) << kv.CheckInvariants().ToString();
  // The replay and the rest of the prompt: the rebuilt window blocks are published as computed,
  // so the next request with the prefix hits without a replay.
  kv.CommitComputed(2, a, 36);
  kv.ReleaseOutsideWindow(2, 36);
  Compute(kv, 2, a, 36, 47);
  kv.Free(2);
  EXPECT_EQ(kv.Match(a, 0), (PrefixHit{40, 40}));
  EXPECT_TRUE(kv.CheckInvariants().ok());
}

// A replay is taken only when it computes fewer tokens than the longest plain hit.
TEST(KvCacheManager, ReplayOnlyWhenItSavesWork) {
  const auto a = Seq(0, 48);
  // A second prompt shares a's first 16 tokens: computed after the eviction, its window blocks
  // make a plain hit of 16 tokens for a.
  const auto d = Concat(Seq(0, 16), Seq(700, 8));
  for (const int64_t replay_tokens : {10, 28, 40}) {
    SCOPED_TRACE(replay_tokens);
    KvCacheManager kv(ReplaySpec(replay_tokens));
    CachePrefixWithoutItsWindow(kv, a);
    ASSERT_TRUE(kv.Allocate(3, 4, d, 0, 0));
    Compute(kv, 3, d, 4, 24);
    kv.Free(3);
    const PrefixHit hit = kv.Match(a, 0);
    if (replay_tokens == 10) {
      EXPECT_EQ(hit, (PrefixHit{40, 28}));  // 28 > 16
    } else {
      EXPECT_EQ(hit, (PrefixHit{16, 16}));  // 40 - 28 = 12 < 16; 40 - 40 = 0
    }
    ASSERT_TRUE(kv.Allocate(2, hit.replay_start + 4, a, 0, hit.num_cached_tokens));
    EXPECT_EQ(kv.NumCachedTokens(2), hit.num_cached_tokens);
    EXPECT_EQ(kv.ReplayStart(2), hit.replay_start);
    EXPECT_TRUE(kv.CheckInvariants().ok());
  }
}

// A spec whose only group is a sliding window has nothing cached to anchor a hit: no replay.
TEST(KvCacheManager, WindowOnlySpecNeverReplays) {
  KvCacheSpec spec = Spec(8, 4, /*sliding_window=*/8);
  spec.replay_tokens = 8;
  KvCacheManager kv(spec);
  EXPECT_EQ(kv.Match(Seq(0, 40), 0), (PrefixHit{0, 0}));
  ASSERT_TRUE(kv.Allocate(1, 8, Seq(0, 40), 0, 32));
  EXPECT_EQ(kv.ReplayStart(1), 0);
  EXPECT_EQ(kv.NumCachedTokens(1), 0);
}

// Blocks evicted between Match and Allocate: Allocate re-checks and takes the shorter replay.
TEST(KvCacheManager, ReplayHitShrinksWhenCompressedBlocksAreEvictedAfterMatch) {
  KvCacheManager kv(ReplaySpec(10));
  const auto a = Seq(0, 48), e = Seq(900, 60);
  CachePrefixWithoutItsWindow(kv, a);
  const PrefixHit hit = kv.Match(a, 0);
  ASSERT_EQ(hit, (PrefixHit{40, 28}));
  // Another request needs 6 blocks of each compressed group (48 tokens): 5 are free, so the
  // cached prefix's last block (positions 32..39; the LRU evicts a request's tail first) goes.
  ASSERT_TRUE(kv.Allocate(4, 4, e, 0, 0));
  for (int64_t n = 8; n <= 48; n += 4) {
    ASSERT_TRUE(kv.Allocate(4, n));
    kv.ReleaseOutsideWindow(4, n);
  }
  EXPECT_EQ(kv.GroupStats(2).cached, 4);
  // The stale Match result: 32 tokens hit, replayed from 32 - 10 rounded down to 20.
  ASSERT_TRUE(kv.Allocate(2, hit.replay_start + 4, a, 0, hit.num_cached_tokens));
  EXPECT_EQ(kv.NumCachedTokens(2), 32);
  EXPECT_EQ(kv.ReplayStart(2), 20);
  EXPECT_EQ(Table(kv, 2, 0).size(), 8u);  // 5 released slots, then blocks for positions 20..31
  EXPECT_EQ(Table(kv, 2, 2).size(), 4u);
  EXPECT_EQ(kv.Stats().prefix_replayed, 12);
  EXPECT_TRUE(kv.CheckInvariants().ok()) << kv.CheckInvariants().ToString();
}

// A replay that does not fit is refused whole: no table, no stats, nothing referenced.
TEST(KvCacheManager, RefusedReplayChangesNothing) {
  KvCacheManager kv(ReplaySpec(10));
  const auto a = Seq(0, 48);
  CachePrefixWithoutItsWindow(kv, a);
  ASSERT_TRUE(kv.Allocate(5, 20, Seq(300, 30), 0, 0));  // 5 of the 6 window blocks
  const PrefixHit hit = kv.Match(a, 0);
  ASSERT_EQ(hit, (PrefixHit{40, 28}));
  const KvCacheStats before = kv.Stats();
  EXPECT_FALSE(kv.CanAllocate(2, 36, hit.num_cached_tokens, a, 0));
  EXPECT_FALSE(kv.Allocate(2, 36, a, 0, hit.num_cached_tokens));
  EXPECT_TRUE(Table(kv, 2, 1).empty());
  const KvCacheStats after = kv.Stats();
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_EQ(after.cached, before.cached);
  EXPECT_EQ(after.prefix_hits, before.prefix_hits);
  EXPECT_EQ(after.prefix_replayed, before.prefix_replayed);
  // One window block is enough for a chunk that stays inside it.
  ASSERT_TRUE(kv.Allocate(2, 32, a, 0, hit.num_cached_tokens));
  EXPECT_EQ(kv.ReplayStart(2), 28);
  EXPECT_TRUE(kv.CheckInvariants().ok()) << kv.CheckInvariants().ToString();
}

}  // namespace
}  // namespace dinfer::kv
