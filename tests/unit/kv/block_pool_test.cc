#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <vector>

namespace dinfer::kv {
namespace {

void ExpectValid(const BlockPool& pool) {
  const Status st = pool.CheckInvariants();
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(BlockPool, OnlyTheNullBlock) {
  BlockPool pool(1);
  EXPECT_EQ(pool.total(), 0);
  EXPECT_EQ(pool.num_available(), 0);
  ExpectValid(pool);
}

TEST(BlockPool, TakesInIdOrderThenMostRecentlyFreed) {
  BlockPool pool(5);
  EXPECT_EQ(pool.Take(), 1);
  EXPECT_EQ(pool.Take(), 2);
  EXPECT_EQ(pool.Take(), 3);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.num_in_use(), 3);
  ExpectValid(pool);
  pool.Unref(1);
  pool.Unref(3);
  EXPECT_EQ(pool.Take(), 3);
  EXPECT_EQ(pool.Take(), 1);
  EXPECT_EQ(pool.Take(), 4);
  EXPECT_EQ(pool.num_available(), 0);
  ExpectValid(pool);
}

TEST(BlockPool, CachedBlocksAreFoundAndEvictedOldestFirst) {
  BlockPool pool(4);
  const BlockId a = pool.Take(), b = pool.Take(), c = pool.Take();
  EXPECT_TRUE(pool.Publish(a, 0xa));
  EXPECT_TRUE(pool.Publish(b, 0xb));
  EXPECT_FALSE(pool.Publish(c, 0xa));  // the first holder keeps the hash
  EXPECT_FALSE(pool.hash(c).has_value());
  EXPECT_EQ(pool.Lookup(0xa), a);
  pool.Unref(b);
  pool.Unref(a);
  pool.Unref(c);
  EXPECT_EQ(pool.num_cached(), 2);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.CachedInEvictionOrder(), (std::vector<BlockId>{b, a}));
  ExpectValid(pool);

  // A hit takes a cached block back into use; the LRU keeps the others in order.
  pool.Ref(b);
  EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.CachedInEvictionOrder(), (std::vector<BlockId>{a}));
  pool.Ref(b);
  EXPECT_EQ(pool.ref_count(b), 2);
  ExpectValid(pool);

  // Free blocks go first, then eviction drops the hash from the index.
  EXPECT_EQ(pool.Take(), c);
  EXPECT_EQ(pool.Take(), a);
  EXPECT_EQ(pool.Lookup(0xa), kNullBlock);
  EXPECT_FALSE(pool.hash(a).has_value());
  EXPECT_EQ(pool.num_available(), 0);
  ExpectValid(pool);

  pool.Unref(b);
  pool.Unref(b);
  EXPECT_EQ(pool.num_cached(), 1);
  EXPECT_EQ(pool.Lookup(0xb), b);
  ExpectValid(pool);
}

}  // namespace
}  // namespace dinfer::kv
