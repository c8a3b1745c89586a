#include "kv/kv_cache_manager.h"

#include <algorithm>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/logging.h"

namespace dinfer::kv {

BlockHash HashBlock(BlockHash parent, std::span<const int32_t> tokens, uint64_t salt) {
  // The seed binds the parent and the salt; the tokens go through XXH3 in one pass.
  const uint64_t key[2] = {parent, salt};
  const uint64_t seed = XXH3_64bits(key, sizeof(key));
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), seed);
}

KvCacheManager::KvCacheManager(const KvCacheSpec& spec) : spec_(spec), pool_(spec.num_blocks) {
  DINFER_CHECK_MSG(spec.block_size > 0, "KV block_size must be positive, got {}", spec.block_size);
  DINFER_CHECK_MSG(spec.sliding_window >= 0, "KV sliding_window must be >= 0, got {}",
                   spec.sliding_window);
}

int64_t KvCacheManager::BlocksFor(int64_t num_tokens) const {
  return num_tokens <= 0 ? 0 : (num_tokens + spec_.block_size - 1) / spec_.block_size;
}

int64_t KvCacheManager::MaxCachedBlocks(int64_t num_tokens) const {
  return num_tokens <= 1 ? 0 : (num_tokens - 1) / spec_.block_size;
}

int64_t KvCacheManager::Match(std::span<const int32_t> tokens, uint64_t salt) {
  if (!spec_.enable_prefix_caching) return 0;
  const int64_t bs = spec_.block_size;
  const int64_t max_blocks = MaxCachedBlocks(static_cast<int64_t>(tokens.size()));
  BlockHash h = 0;
  int64_t hits = 0;
  while (hits < max_blocks) {
    h = HashBlock(h, tokens.subspan(static_cast<size_t>(hits * bs), static_cast<size_t>(bs)), salt);
    if (pool_.Lookup(h) == kNullBlock) break;
    ++hits;
  }
  return hits * bs;
}

KvCacheManager::Plan KvCacheManager::MakePlan(RequestId request, int64_t total_tokens,
                                              std::span<const int32_t> tokens, uint64_t salt,
                                              int64_t num_cached_tokens) const {
  Plan plan;
  const int64_t want = BlocksFor(total_tokens);
  auto it = requests_.find(request);
  if (it != requests_.end()) {
    plan.num_new = std::max<int64_t>(0, want - static_cast<int64_t>(it->second.table.size()));
    plan.pool_cost = plan.num_new;
    return plan;
  }
  const int64_t bs = spec_.block_size;
  int64_t max_reuse = 0;
  if (spec_.enable_prefix_caching && num_cached_tokens > 0) {
    max_reuse = std::min(num_cached_tokens, std::max<int64_t>(total_tokens, 0)) / bs;
    if (!tokens.empty()) {
      max_reuse = std::min(max_reuse, MaxCachedBlocks(static_cast<int64_t>(tokens.size())));
    }
  }
  int64_t num_reused = max_reuse;
  int64_t num_cached_now = 0;
  if (!tokens.empty()) {
    num_reused = 0;
    BlockHash h = 0;
    while (num_reused < max_reuse) {
      h = HashBlock(
          h, tokens.subspan(static_cast<size_t>(num_reused * bs), static_cast<size_t>(bs)), salt);
      const BlockId id = pool_.Lookup(h);
      if (id == kNullBlock) break;
      plan.reused.push_back(id);
      plan.last_hash = h;
      if (pool_.ref_count(id) == 0) ++num_cached_now;
      ++num_reused;
    }
  }
  plan.num_new = want - num_reused;
  plan.pool_cost = plan.num_new + num_cached_now;
  return plan;
}

int64_t KvCacheManager::BlocksNeeded(RequestId request, int64_t total_tokens,
                                     int64_t num_cached_tokens, std::span<const int32_t> tokens,
                                     uint64_t salt) const {
  return MakePlan(request, total_tokens, tokens, salt, num_cached_tokens).pool_cost;
}

bool KvCacheManager::CanAllocate(RequestId request, int64_t total_tokens, int64_t num_cached_tokens,
                                 std::span<const int32_t> tokens, uint64_t salt) const {
  return BlocksNeeded(request, total_tokens, num_cached_tokens, tokens, salt) <=
         pool_.num_available();
}

bool KvCacheManager::Allocate(RequestId request, int64_t total_tokens,
                              std::span<const int32_t> tokens, uint64_t salt,
                              int64_t num_cached_tokens) {
  if (tokens.empty()) num_cached_tokens = 0;
  Plan plan = MakePlan(request, total_tokens, tokens, salt, num_cached_tokens);
  if (plan.pool_cost > pool_.num_available()) return false;
  // A request holding no blocks stays unknown, so its first real allocation can still reuse.
  if (plan.num_new == 0 && plan.reused.empty() && !requests_.contains(request)) return true;

  auto [it, is_new] = requests_.try_emplace(request);
  RequestState& state = it->second;
  if (is_new) {
    // Reused blocks are referenced before any Take(), so the evictions below cannot hit them.
    for (BlockId id : plan.reused) pool_.Ref(id);
    state.table = std::move(plan.reused);
    state.num_committed_blocks = static_cast<int64_t>(state.table.size());
    state.num_cached_tokens = state.num_committed_blocks * spec_.block_size;
    state.last_hash = plan.last_hash;
    state.salt = salt;
    // Counted at admission, not in Match: a waiting request is matched again at every step it
    // stays blocked.
    if (spec_.enable_prefix_caching && !tokens.empty()) {
      prefix_queries_ += static_cast<int64_t>(tokens.size());
      prefix_hits_ += state.num_cached_tokens;
    }
  }
  state.table.reserve(state.table.size() + static_cast<size_t>(plan.num_new));
  for (int64_t i = 0; i < plan.num_new; ++i) state.table.push_back(pool_.Take());
  return true;
}

void KvCacheManager::CommitComputed(RequestId request, std::span<const int32_t> tokens,
                                    int64_t num_computed_tokens) {
  if (!spec_.enable_prefix_caching) return;
  auto it = requests_.find(request);
  if (it == requests_.end()) return;
  RequestState& state = it->second;
  const int64_t bs = spec_.block_size;
  const int64_t full = std::min({num_computed_tokens / bs, static_cast<int64_t>(tokens.size()) / bs,
                                 static_cast<int64_t>(state.table.size())});
  while (state.num_committed_blocks < full) {
    const int64_t i = state.num_committed_blocks;
    const BlockId id = state.table[static_cast<size_t>(i)];
    // Released before it was committed: its KV is gone, so no later block can be found by a
    // prefix walk either.
    if (id == kNullBlock) break;
    const BlockHash h =
        HashBlock(state.last_hash,
                  tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs)), state.salt);
    // A duplicate of an indexed block stays private; the chain goes on through its hash anyway.
    (void)pool_.Publish(id, h);
    state.last_hash = h;
    ++state.num_committed_blocks;
  }
}

void KvCacheManager::ReleaseOutsideWindow(RequestId request, int64_t next_position) {
  if (spec_.sliding_window == 0) return;
  auto it = requests_.find(request);
  if (it == requests_.end()) return;
  RequestState& state = it->second;
  // Block i holds positions up to (i + 1) * bs - 1; it is dead when that is <= next - W.
  const int64_t first_live = next_position - spec_.sliding_window + 1;
  const int64_t dead = std::min(first_live <= 0 ? 0 : first_live / spec_.block_size,
                                static_cast<int64_t>(state.table.size()));
  // Last block first, as in Free: the oldest blocks of the request stay cached longest.
  for (int64_t i = dead - 1; i >= state.num_released_blocks; --i) {
    BlockId& slot = state.table[static_cast<size_t>(i)];
    if (slot != kNullBlock) pool_.Unref(slot);
    slot = kNullBlock;
  }
  state.num_released_blocks = std::max(state.num_released_blocks, dead);
}

void KvCacheManager::Free(RequestId request) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return;
  const std::vector<BlockId>& table = it->second.table;
  for (auto b = table.rbegin(); b != table.rend(); ++b) {
    if (*b != kNullBlock) pool_.Unref(*b);
  }
  requests_.erase(it);
}

std::span<const BlockId> KvCacheManager::BlockTable(RequestId request) const {
  auto it = requests_.find(request);
  if (it == requests_.end()) return {};
  return it->second.table;
}

int64_t KvCacheManager::NumCachedTokens(RequestId request) const {
  auto it = requests_.find(request);
  return it == requests_.end() ? 0 : it->second.num_cached_tokens;
}

KvCacheStats KvCacheManager::Stats() const {
  KvCacheStats s;
  s.total = pool_.total();
  s.free = pool_.num_free();
  s.cached = pool_.num_cached();
  s.in_use = pool_.num_in_use();
  s.prefix_queries = prefix_queries_;
  s.prefix_hits = prefix_hits_;
  return s;
}

double KvCacheManager::Usage() const {
  const int64_t total = pool_.total();
  return total == 0 ? 0.0 : static_cast<double>(pool_.num_in_use()) / static_cast<double>(total);
}

Status KvCacheManager::CheckInvariants() const {
  DINFER_RETURN_IF_ERROR(pool_.CheckInvariants());
  const int64_t total = pool_.total();
  std::vector<int32_t> refs(static_cast<size_t>(total + 1), 0);
  for (const auto& [id, state] : requests_) {
    const int64_t size = static_cast<int64_t>(state.table.size());
    if (state.num_committed_blocks < 0 || state.num_committed_blocks > size ||
        state.num_released_blocks < 0 || state.num_released_blocks > size) {
      return Internal("KV request {}: {} committed / {} released blocks in a table of {}", id,
                      state.num_committed_blocks, state.num_released_blocks, size);
    }
    if (spec_.sliding_window == 0 && state.num_released_blocks != 0) {
      return Internal("KV request {}: released blocks under full attention", id);
    }
    if (state.num_cached_tokens % spec_.block_size != 0 ||
        state.num_cached_tokens > state.num_committed_blocks * spec_.block_size) {
      return Internal("KV request {}: {} cached tokens but {} committed blocks of {}", id,
                      state.num_cached_tokens, state.num_committed_blocks, spec_.block_size);
    }
    for (int64_t i = 0; i < size; ++i) {
      const BlockId b = state.table[static_cast<size_t>(i)];
      const bool released = i < state.num_released_blocks;
      if (released != (b == kNullBlock)) {
        return Internal("KV request {}: slot {} holds block {} but {} released blocks", id, i, b,
                        state.num_released_blocks);
      }
      if (b == kNullBlock) continue;
      if (b < 0 || b > total)
        return Internal("KV request {}: slot {} holds invalid block {}", id, i, b);
      ++refs[static_cast<size_t>(b)];
      // Blocks past the committed prefix were taken fresh and never published.
      if (i >= state.num_committed_blocks && pool_.hash(b).has_value()) {
        return Internal("KV request {}: uncommitted slot {} holds hashed block {}", id, i, b);
      }
    }
  }
  for (BlockId b = 1; b <= total; ++b) {
    if (pool_.ref_count(b) != refs[static_cast<size_t>(b)]) {
      return Internal("KV block {}: ref_count {} but {} block-table occurrences", b,
                      pool_.ref_count(b), refs[static_cast<size_t>(b)]);
    }
  }
  if (prefix_hits_ < 0 || prefix_hits_ > prefix_queries_) {
    return Internal("KV prefix stats: {} hits out of {} queried tokens", prefix_hits_,
                    prefix_queries_);
  }
  return OkStatus();
}

}  // namespace dinfer::kv
