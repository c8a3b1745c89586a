// BlockPool: the blocks of one KV cache as host-side metadata (no tensors). It owns each block's
// reference count and hash, the free list, the LRU of cached blocks and the hash index, and keeps
// every block in exactly one state:
//   free    ref_count 0, no hash, on the free list;
//   cached  ref_count 0, holding a committed hash, on the LRU (evictable, still found by Lookup);
//   in use  ref_count > 0 (it may hold a hash too).
// A block holds a hash if and only if the index maps that hash to it. Block 0 is the null block:
// never handed out, in no list. Policy (what to hash, when to drop references) belongs to
// KvCacheManager. Not thread-safe: owned by one KvCacheManager.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace dinfer::kv {

using BlockId = int32_t;
using BlockHash = uint64_t;

// Block 0 is the null block: never allocated, it stands in block tables for blocks that a
// sliding window released (their slots are never read).
inline constexpr BlockId kNullBlock = 0;

class BlockPool {
 public:
  // `num_blocks` includes the null block; blocks 1..num_blocks-1 start free.
  explicit BlockPool(int64_t num_blocks);

  int64_t total() const { return static_cast<int64_t>(blocks_.size()) - 1; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_cached() const { return num_cached_; }
  int64_t num_in_use() const { return total() - num_free() - num_cached(); }
  // Blocks Take() can hand out: free ones, then cached ones by eviction.
  int64_t num_available() const { return num_free() + num_cached(); }

  // Hands out a block with ref_count 1: the most recently freed free block if there is one (so
  // a fresh pool hands out 1, 2, 3, ...), else the least recently cached block, whose hash leaves
  // the index. Requires num_available() > 0.
  BlockId Take();
  // Adds a reference to an in-use or cached block; a cached block leaves the LRU.
  void Ref(BlockId id);
  // Drops a reference; at zero the block joins the LRU tail (it holds a hash) or the free list.
  void Unref(BlockId id);

  // The block holding `hash`, or kNullBlock.
  BlockId Lookup(BlockHash hash) const;
  // Gives in-use block `id` (holding no hash yet) the hash `hash`. Returns false and changes
  // nothing when another block already holds it: the first holder stays the index entry.
  bool Publish(BlockId id, BlockHash hash);

  int32_t ref_count(BlockId id) const { return blocks_[static_cast<size_t>(id)].ref_count; }
  std::optional<BlockHash> hash(BlockId id) const;
  // Cached blocks from least to most recently cached (the eviction order); O(cached).
  std::vector<BlockId> CachedInEvictionOrder() const;

  // Checks the states, lists, counts and index against each other; Internal on the first
  // violation. O(num_blocks).
  Status CheckInvariants() const;

 private:
  static constexpr BlockId kNone = -1;
  struct Block {
    int32_t ref_count = 0;
    bool has_hash = false;
    BlockHash hash = 0;
    // Neighbours on the LRU while cached, kNone otherwise.
    BlockId prev = kNone;
    BlockId next = kNone;
  };

  Block& at(BlockId id) { return blocks_[static_cast<size_t>(id)]; }
  const Block& at(BlockId id) const { return blocks_[static_cast<size_t>(id)]; }
  void LruPushBack(BlockId id);
  void LruRemove(BlockId id);

  std::vector<Block> blocks_;
  std::vector<BlockId> free_;  // a stack: the back is handed out next
  BlockId lru_head_ = kNone;   // least recently cached: evicted first
  BlockId lru_tail_ = kNone;
  int64_t num_cached_ = 0;
  std::unordered_map<BlockHash, BlockId> index_;
};

}  // namespace dinfer::kv
