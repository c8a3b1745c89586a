#include "kv/block_pool.h"

#include "base/logging.h"

namespace dinfer::kv {

BlockPool::BlockPool(int64_t num_blocks) {
  DINFER_CHECK_MSG(num_blocks >= 1 && num_blocks <= INT32_MAX,
                   "a KV block pool needs 1..2^31-1 blocks (the null block included), got {}",
                   num_blocks);
  blocks_.resize(static_cast<size_t>(num_blocks));
  free_.reserve(static_cast<size_t>(num_blocks - 1));
  for (int64_t id = num_blocks - 1; id >= 1; --id) free_.push_back(static_cast<BlockId>(id));
}

BlockId BlockPool::Take() {
  BlockId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    DINFER_CHECK_MSG(lru_head_ != kNone, "BlockPool::Take on an exhausted pool");
    id = lru_head_;
    LruRemove(id);
    Block& b = at(id);
    index_.erase(b.hash);
    b.has_hash = false;
    b.hash = 0;
  }
  at(id).ref_count = 1;
  return id;
}

void BlockPool::Ref(BlockId id) {
  DINFER_CHECK(id > kNullBlock && id <= total());
  Block& b = at(id);
  if (b.ref_count == 0) {
    // Only cached blocks can be found again; a free block is reached through Take() only.
    DINFER_CHECK_MSG(b.has_hash, "BlockPool::Ref on free block {}", id);
    LruRemove(id);
  }
  ++b.ref_count;
}

void BlockPool::Unref(BlockId id) {
  DINFER_CHECK(id > kNullBlock && id <= total());
  Block& b = at(id);
  DINFER_CHECK_MSG(b.ref_count > 0, "BlockPool::Unref on unreferenced block {}", id);
  if (--b.ref_count > 0) return;
  if (b.has_hash) {
    LruPushBack(id);
  } else {
    free_.push_back(id);
  }
}

BlockId BlockPool::Lookup(BlockHash hash) const {
  auto it = index_.find(hash);
  return it == index_.end() ? kNullBlock : it->second;
}

bool BlockPool::Publish(BlockId id, BlockHash hash) {
  DINFER_CHECK(id > kNullBlock && id <= total());
  Block& b = at(id);
  DINFER_CHECK_MSG(b.ref_count > 0 && !b.has_hash,
                   "BlockPool::Publish needs an in-use block without a hash, block {}", id);
  if (!index_.try_emplace(hash, id).second) return false;
  b.has_hash = true;
  b.hash = hash;
  return true;
}

std::optional<BlockHash> BlockPool::hash(BlockId id) const {
  const Block& b = at(id);
  return b.has_hash ? std::optional<BlockHash>(b.hash) : std::nullopt;
}

std::vector<BlockId> BlockPool::CachedInEvictionOrder() const {
  std::vector<BlockId> out;
  out.reserve(static_cast<size_t>(num_cached_));
  for (BlockId id = lru_head_; id != kNone; id = at(id).next) out.push_back(id);
  return out;
}

void BlockPool::LruPushBack(BlockId id) {
  Block& b = at(id);
  b.prev = lru_tail_;
  b.next = kNone;
  if (lru_tail_ != kNone) {
    at(lru_tail_).next = id;
  } else {
    lru_head_ = id;
  }
  lru_tail_ = id;
  ++num_cached_;
}

void BlockPool::LruRemove(BlockId id) {
  Block& b = at(id);
  if (b.prev != kNone) {
    at(b.prev).next = b.next;
  } else {
    lru_head_ = b.next;
  }
  if (b.next != kNone) {
    at(b.next).prev = b.prev;
  } else {
    lru_tail_ = b.prev;
  }
  b.prev = b.next = kNone;
  --num_cached_;
}

Status BlockPool::CheckInvariants() const {
  const size_t n = blocks_.size();
  const Block& null = blocks_[0];
  if (null.ref_count != 0 || null.has_hash || null.prev != kNone || null.next != kNone) {
    return Internal("KV pool: the null block is referenced, hashed or listed");
  }
  // Where each block was found: 0 nowhere, 1 free list, 2 LRU.
  std::vector<uint8_t> listed(n, 0);
  for (BlockId id : free_) {
    if (id <= kNullBlock || static_cast<size_t>(id) >= n) {
      return Internal("KV pool: free list holds invalid block {}", id);
    }
    if (listed[static_cast<size_t>(id)] != 0) {
      return Internal("KV pool: block {} is on the free list twice", id);
    }
    listed[static_cast<size_t>(id)] = 1;
  }
  int64_t lru_len = 0;
  BlockId prev = kNone;
  for (BlockId id = lru_head_; id != kNone; id = at(id).next) {
    if (id <= kNullBlock || static_cast<size_t>(id) >= n) {
      return Internal("KV pool: LRU holds invalid block {}", id);
    }
    if (listed[static_cast<size_t>(id)] != 0) {
      return Internal("KV pool: block {} is on the LRU twice or also on the free list", id);
    }
    if (at(id).prev != prev) return Internal("KV pool: LRU back link of block {} is broken", id);
    listed[static_cast<size_t>(id)] = 2;
    prev = id;
    ++lru_len;
  }
  if (prev != lru_tail_)
    return Internal("KV pool: LRU tail is {}, the walk ends at {}", lru_tail_, prev);
  if (lru_len != num_cached_) {
    return Internal("KV pool: LRU holds {} blocks, the cached count says {}", lru_len, num_cached_);
  }
  int64_t free = 0, cached = 0, in_use = 0, hashed = 0;
  for (size_t i = 1; i < n; ++i) {
    const Block& b = blocks_[i];
    const BlockId id = static_cast<BlockId>(i);
    if (b.ref_count < 0) return Internal("KV pool: block {} has ref_count {}", id, b.ref_count);
    if (b.has_hash) {
      ++hashed;
      auto it = index_.find(b.hash);
      if (it == index_.end() || it->second != id) {
        return Internal("KV pool: block {} holds hash {:#x} but the index does not point at it", id,
                        b.hash);
      }
    }
    if (b.ref_count > 0) {
      if (listed[i] != 0) {
        return Internal("KV pool: block {} has ref_count {} but is on the {}", id, b.ref_count,
                        listed[i] == 1 ? "free list" : "LRU");
      }
      ++in_use;
    } else if (b.has_hash) {
      if (listed[i] != 2) return Internal("KV pool: cached block {} is not on the LRU", id);
      ++cached;
    } else {
      if (listed[i] != 1) return Internal("KV pool: free block {} is not on the free list", id);
      ++free;
    }
  }
  if (hashed != static_cast<int64_t>(index_.size())) {
    return Internal("KV pool: {} blocks hold hashes but the index has {} entries", hashed,
                    index_.size());
  }
  if (free != num_free() || cached != num_cached_ || free + cached + in_use != total()) {
    return Internal("KV pool: counted free {} + cached {} + in use {} vs lists {} + {}, total {}",
                    free, cached, in_use, num_free(), num_cached_, total());
  }
  return OkStatus();
}

}  // namespace dinfer::kv
