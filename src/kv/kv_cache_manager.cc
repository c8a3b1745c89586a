#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <numeric>

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

KvGroupSpec KvCacheSpec::group(int64_t g) const {
  if (g == 0) return KvGroupSpec{num_blocks, block_size, sliding_window, 1};
  return extra_groups[static_cast<size_t>(g - 1)];
}

KvCacheManager::KvCacheManager(const KvCacheSpec& spec) : spec_(spec) {
  for (int64_t g = 0; g < spec.num_groups(); ++g) {
    const KvGroupSpec gs = spec.group(g);
    DINFER_CHECK_MSG(gs.block_size > 0, "KV group {}: block_size must be positive, got {}", g,
                     gs.block_size);
    DINFER_CHECK_MSG(gs.sliding_window >= 0, "KV group {}: sliding_window must be >= 0, got {}", g,
                     gs.sliding_window);
    DINFER_CHECK_MSG(gs.entry_rate > 0 && gs.block_size % gs.entry_rate == 0,
                     "KV group {}: entry rate {} does not divide blocks of {}", g, gs.entry_rate,
                     gs.block_size);
    DINFER_CHECK_MSG(gs.sliding_window == 0 || gs.entry_rate == 1,
                     "KV group {}: a sliding window needs a row per token", g);
    groups_.push_back(Group{gs, BlockPool(gs.num_blocks), gs.block_size / gs.entry_rate});
    if (gs.sliding_window > 0) window_alignment_ = std::lcm(window_alignment_, gs.block_size);
  }
  DINFER_CHECK_MSG(spec.replay_tokens >= 0, "replay_tokens must be >= 0, got {}",
                   spec.replay_tokens);
  // A replay rebuilds window groups next to groups that anchor the hit in the cache.
  const auto windowed = [](const Group& g) { return g.spec.sliding_window > 0; };
  can_replay_ = spec.replay_tokens > 0 && std::any_of(groups_.begin(), groups_.end(), windowed) &&
                !std::all_of(groups_.begin(), groups_.end(), windowed);
}

int64_t KvCacheManager::ReplayStartFor(int64_t n) const {
  const int64_t s = n - spec_.replay_tokens;
  return s <= 0 ? 0 : s / window_alignment_ * window_alignment_;
}

int64_t KvCacheManager::BlocksFor(const Group& g, int64_t n) const {
  const int64_t rows = n <= 0 ? 0 : n / g.spec.entry_rate;
  return (rows + g.rows_per_block - 1) / g.rows_per_block;
}

int64_t KvCacheManager::FullBlocks(const Group& g, int64_t n) const {
  return n <= 0 ? 0 : n / g.spec.entry_rate / g.rows_per_block;
}

int64_t KvCacheManager::DeadBlocks(const Group& g, int64_t n) const {
  if (g.spec.sliding_window == 0) return 0;
  // Block i holds positions up to (i + 1) * bs - 1; it is dead when that is <= n - W.
  const int64_t first_live = n - g.spec.sliding_window + 1;
  return first_live <= 0 ? 0 : first_live / g.spec.block_size;
}

bool KvCacheManager::Aligned(int64_t n) const {
  for (const Group& g : groups_) {
    if ((n / g.spec.entry_rate) % g.rows_per_block != 0) return false;
  }
  return true;
}

int64_t KvCacheManager::MaxCachedTokens(int64_t num_tokens) const {
  const int64_t bs = groups_[0].spec.block_size;
  return num_tokens <= 1 ? 0 : (num_tokens - 1) / bs * bs;
}

PrefixHit KvCacheManager::FindHit(std::span<const int32_t> tokens, uint64_t salt, int64_t limit,
                                  Lookup* lookup) const {
  const size_t num_groups = groups_.size();
  lookup->blocks.assign(num_groups, {});
  lookup->hashes.assign(num_groups, {});
  limit = std::min(limit, static_cast<int64_t>(tokens.size()));
  if (limit <= 0) return {};
  // Per group: the blocks of the prefix, up to the first miss where every block is needed; all
  // of them for windows (a miss behind the window does not matter).
  std::vector<std::vector<int64_t>> runs(num_groups);  // windows: cached blocks ending at i
  for (size_t gi = 0; gi < num_groups; ++gi) {
    const Group& g = groups_[gi];
    const int64_t bs = g.spec.block_size, n = FullBlocks(g, limit);
    auto& blocks = lookup->blocks[gi];
    auto& hashes = lookup->hashes[gi];
    BlockHash h = 0;
    for (int64_t i = 0; i < n; ++i) {
      h = HashBlock(h, tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs)), salt);
      const BlockId id = g.pool.Lookup(h);
      if (id == kNullBlock && g.spec.sliding_window == 0) break;
      blocks.push_back(id);
      hashes.push_back(h);
      if (g.spec.sliding_window > 0) {
        runs[gi].push_back(id == kNullBlock ? 0 : (i == 0 ? 1 : runs[gi][i - 1] + 1));
      }
    }
  }
  // From the longest prefix down: the first one every group holds is the plain hit; the first
  // one the groups other than the windows hold is the best replay candidate (a longer prefix
  // never starts its replay earlier).
  const int64_t step = groups_[0].spec.block_size;
  int64_t replay = 0;
  for (int64_t t = limit / step * step; t > 0; t -= step) {
    if (!Aligned(t)) continue;
    bool others = true, windows = true;
    for (size_t gi = 0; gi < num_groups && others; ++gi) {
      const Group& g = groups_[gi];
      const int64_t need = FullBlocks(g, t);
      if (g.spec.sliding_window == 0) {
        others = need <= static_cast<int64_t>(lookup->blocks[gi].size());
      } else {
        const int64_t live = need - std::min(need, DeadBlocks(g, t));
        windows = windows && (live == 0 || runs[gi][static_cast<size_t>(need - 1)] >= live);
      }
    }
    if (!others) continue;
    if (windows) {
      // Replay only when it computes fewer tokens than this plain hit leaves.
      if (replay > 0 && ReplayStartFor(replay) > t) return {replay, ReplayStartFor(replay)};
      return {t, t};
    }
    if (replay == 0 && can_replay_) replay = t;
  }
  if (replay > 0 && ReplayStartFor(replay) > 0) return {replay, ReplayStartFor(replay)};
  return {};
}

PrefixHit KvCacheManager::Match(std::span<const int32_t> tokens, uint64_t salt) const {
  if (!spec_.enable_prefix_caching) return {};
  Lookup lookup;
  return FindHit(tokens, salt, MaxCachedTokens(static_cast<int64_t>(tokens.size())), &lookup);
}

KvCacheManager::Plan KvCacheManager::MakePlan(RequestId request, int64_t total_tokens,
                                              std::span<const int32_t> tokens, uint64_t salt,
                                              int64_t num_cached_tokens) const {
  Plan plan;
  plan.groups.resize(groups_.size());
  auto it = requests_.find(request);
  if (it != requests_.end()) {
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      GroupPlan& gp = plan.groups[gi];
      gp.num_new =
          std::max<int64_t>(0, BlocksFor(groups_[gi], total_tokens) -
                                   static_cast<int64_t>(it->second.groups[gi].table.size()));
      gp.pool_cost = gp.num_new;
    }
    return plan;
  }
  int64_t reuse = 0;
  if (spec_.enable_prefix_caching && num_cached_tokens > 0) {
    reuse = num_cached_tokens;
    if (!tokens.empty()) {
      reuse = std::min(reuse, MaxCachedTokens(static_cast<int64_t>(tokens.size())));
    }
  }
  Lookup lookup;
  PrefixHit hit;
  if (!tokens.empty()) {
    hit = FindHit(tokens, salt, reuse, &lookup);
    // Computation starts at most at total_tokens; only a shorter prefix can then hit.
    if (hit.replay_start > total_tokens) {
      hit = FindHit(tokens, salt, std::max<int64_t>(total_tokens, 0), &lookup);
    }
  } else {
    reuse = std::min(reuse, std::max<int64_t>(total_tokens, 0));
    while (reuse > 0 && !Aligned(reuse)) --reuse;
    hit = {reuse, reuse};
  }
  plan.hit = hit;
  const bool replay = hit.replay_start < hit.num_cached_tokens;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    GroupPlan& gp = plan.groups[gi];
    // A replay rewrites the window groups from S on, in fresh blocks: it reuses none of theirs.
    const bool rebuilt = replay && g.spec.sliding_window > 0;
    const int64_t full = FullBlocks(g, rebuilt ? hit.replay_start : hit.num_cached_tokens);
    gp.num_released = rebuilt ? full : std::min(full, DeadBlocks(g, hit.num_cached_tokens));
    int64_t num_cached_now = 0;
    if (!tokens.empty()) {
      for (int64_t i = 0; i < full; ++i) {
        const BlockId id =
            i < gp.num_released ? kNullBlock : lookup.blocks[gi][static_cast<size_t>(i)];
        gp.reused.push_back(id);
        if (id != kNullBlock && g.pool.ref_count(id) == 0) ++num_cached_now;
      }
      if (full > 0) gp.last_hash = lookup.hashes[gi][static_cast<size_t>(full - 1)];
    }
    gp.num_new = std::max<int64_t>(0, BlocksFor(g, total_tokens) - full);
    gp.pool_cost = gp.num_new + num_cached_now;
  }
  return plan;
}

int64_t KvCacheManager::BlocksNeeded(RequestId request, int64_t total_tokens,
                                     int64_t num_cached_tokens, std::span<const int32_t> tokens,
                                     uint64_t salt, int64_t group) const {
  return MakePlan(request, total_tokens, tokens, salt, num_cached_tokens)
      .groups[static_cast<size_t>(group)]
      .pool_cost;
}

bool KvCacheManager::CanAllocate(RequestId request, int64_t total_tokens, int64_t num_cached_tokens,
                                 std::span<const int32_t> tokens, uint64_t salt) const {
  const Plan plan = MakePlan(request, total_tokens, tokens, salt, num_cached_tokens);
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    if (plan.groups[gi].pool_cost > groups_[gi].pool.num_available()) return false;
  }
  return true;
}

bool KvCacheManager::Allocate(RequestId request, int64_t total_tokens,
                              std::span<const int32_t> tokens, uint64_t salt,
                              int64_t num_cached_tokens) {
  if (tokens.empty()) num_cached_tokens = 0;
  Plan plan = MakePlan(request, total_tokens, tokens, salt, num_cached_tokens);
  bool empty = true;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const GroupPlan& gp = plan.groups[gi];
    if (gp.pool_cost > groups_[gi].pool.num_available()) return false;
    empty = empty && gp.num_new == 0 && gp.reused.empty();
  }
  // A request holding no blocks stays unknown, so its first real allocation can still reuse.
  if (empty && !requests_.contains(request)) return true;

  auto [it, is_new] = requests_.try_emplace(request);
  RequestState& state = it->second;
  if (is_new) {
    state.groups.resize(groups_.size());
    state.num_cached_tokens = plan.hit.num_cached_tokens;
    state.replay_start = plan.hit.replay_start;
    state.salt = salt;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      GroupPlan& gp = plan.groups[gi];
      GroupState& gs = state.groups[gi];
      // Reused blocks are referenced before any Take(), so the evictions below cannot hit them.
      for (BlockId id : gp.reused) {
        if (id != kNullBlock) groups_[gi].pool.Ref(id);
      }
      gs.num_committed_blocks = static_cast<int64_t>(gp.reused.size());
      gs.num_released_blocks = gp.num_released;
      gs.last_hash = gp.last_hash;
      gs.table = std::move(gp.reused);
    }
    // Counted at admission, not in Match: a waiting request is matched again at every step it
    // stays blocked.
    if (spec_.enable_prefix_caching && !tokens.empty()) {
      prefix_queries_ += static_cast<int64_t>(tokens.size());
      prefix_hits_ += state.num_cached_tokens;
      prefix_replayed_ += plan.hit.num_replay_tokens();
    }
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    std::vector<BlockId>& table = state.groups[gi].table;
    const int64_t num_new = plan.groups[gi].num_new;
    table.reserve(table.size() + static_cast<size_t>(num_new));
    for (int64_t i = 0; i < num_new; ++i) table.push_back(groups_[gi].pool.Take());
  }
  return true;
}

void KvCacheManager::CommitComputed(RequestId request, std::span<const int32_t> tokens,
                                    int64_t num_computed_tokens) {
  if (!spec_.enable_prefix_caching) return;
  auto it = requests_.find(request);
  if (it == requests_.end()) return;
  RequestState& state = it->second;
  const int64_t known = std::min(num_computed_tokens, static_cast<int64_t>(tokens.size()));
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    GroupState& gs = state.groups[gi];
    const int64_t bs = g.spec.block_size;
    const int64_t full = std::min(FullBlocks(g, known), static_cast<int64_t>(gs.table.size()));
    while (gs.num_committed_blocks < full) {
      const int64_t i = gs.num_committed_blocks;
      const BlockId id = gs.table[static_cast<size_t>(i)];
      const BlockHash h = HashBlock(
          gs.last_hash, tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs)),
          state.salt);
      // A duplicate of an indexed block stays private; the chain goes on through its hash anyway.
      // A window slot released before its commit has no KV to publish.
      if (id != kNullBlock) (void)g.pool.Publish(id, h);
      gs.last_hash = h;
      ++gs.num_committed_blocks;
    }
  }
}

void KvCacheManager::ReleaseOutsideWindow(RequestId request, int64_t next_position) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    if (g.spec.sliding_window == 0) continue;
    GroupState& gs = it->second.groups[gi];
    const int64_t dead =
        std::min(DeadBlocks(g, next_position), static_cast<int64_t>(gs.table.size()));
    // Last block first, as in Free: the oldest blocks of the request stay cached longest.
    for (int64_t i = dead - 1; i >= gs.num_released_blocks; --i) {
      BlockId& slot = gs.table[static_cast<size_t>(i)];
      if (slot != kNullBlock) g.pool.Unref(slot);
      slot = kNullBlock;
    }
    gs.num_released_blocks = std::max(gs.num_released_blocks, dead);
  }
}

void KvCacheManager::Free(RequestId request) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const std::vector<BlockId>& table = it->second.groups[gi].table;
    for (auto b = table.rbegin(); b != table.rend(); ++b) {
      if (*b != kNullBlock) groups_[gi].pool.Unref(*b);
    }
  }
  requests_.erase(it);
}

std::span<const BlockId> KvCacheManager::BlockTable(RequestId request, int64_t group) const {
  auto it = requests_.find(request);
  if (it == requests_.end()) return {};
  return it->second.groups[static_cast<size_t>(group)].table;
}

int64_t KvCacheManager::NumCachedTokens(RequestId request) const {
  auto it = requests_.find(request);
  return it == requests_.end() ? 0 : it->second.num_cached_tokens;
}

int64_t KvCacheManager::ReplayStart(RequestId request) const {
  auto it = requests_.find(request);
  return it == requests_.end() ? 0 : it->second.replay_start;
}

Status KvCacheManager::CheckCanEverHold(int64_t num_tokens) const {
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    const int64_t blocks = BlocksFor(g, num_tokens);
    if (g.spec.sliding_window == 0 && blocks > g.pool.total()) {
      return MakeError(StatusCode::kResourceExhausted,
                       "needs {} KV blocks for {} tokens but the cache holds {} blocks{}", blocks,
                       num_tokens, g.pool.total(),
                       groups_.size() > 1 ? fmt::format(" (KV group {})", gi) : "");
    }
  }
  return OkStatus();
}

KvCacheStats KvCacheManager::GroupStats(int64_t group) const {
  const BlockPool& pool = groups_[static_cast<size_t>(group)].pool;
  KvCacheStats s;
  s.total = pool.total();
  s.free = pool.num_free();
  s.cached = pool.num_cached();
  s.in_use = pool.num_in_use();
  return s;
}

KvCacheStats KvCacheManager::Stats() const {
  KvCacheStats s;
  for (int64_t g = 0; g < num_groups(); ++g) {
    const KvCacheStats gs = GroupStats(g);
    s.total += gs.total;
    s.free += gs.free;
    s.cached += gs.cached;
    s.in_use += gs.in_use;
  }
  s.prefix_queries = prefix_queries_;
  s.prefix_hits = prefix_hits_;
  s.prefix_replayed = prefix_replayed_;
  s.usage = Usage();
  return s;
}

double KvCacheManager::Usage() const {
  double usage = 0;
  for (const Group& g : groups_) {
    const int64_t total = g.pool.total();
    if (total > 0) {
      usage =
          std::max(usage, static_cast<double>(g.pool.num_in_use()) / static_cast<double>(total));
    }
  }
  return usage;
}

Status KvCacheManager::CheckInvariants() const {
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    DINFER_RETURN_IF_ERROR(g.pool.CheckInvariants());
    const int64_t total = g.pool.total();
    std::vector<int32_t> refs(static_cast<size_t>(total + 1), 0);
    for (const auto& [id, state] : requests_) {
      if (state.groups.size() != groups_.size()) {
        return Internal("KV request {}: {} group tables for {} groups", id, state.groups.size(),
                        groups_.size());
      }
      const GroupState& gs = state.groups[gi];
      const int64_t size = static_cast<int64_t>(gs.table.size());
      if (gs.num_committed_blocks < 0 || gs.num_committed_blocks > size ||
          gs.num_released_blocks < 0 || gs.num_released_blocks > size) {
        return Internal(
            "KV request {} group {}: {} committed / {} released blocks in a table of {}", id, gi,
            gs.num_committed_blocks, gs.num_released_blocks, size);
      }
      if (g.spec.sliding_window == 0 && gs.num_released_blocks != 0) {
        return Internal("KV request {} group {}: released blocks under full attention", id, gi);
      }
      // A replay's window groups reuse nothing: their chain starts at the replay start.
      const int64_t reused =
          g.spec.sliding_window > 0 ? state.replay_start : state.num_cached_tokens;
      if (reused > 0 && FullBlocks(g, reused) > gs.num_committed_blocks) {
        return Internal("KV request {} group {}: {} cached tokens but {} committed blocks", id, gi,
                        reused, gs.num_committed_blocks);
      }
      for (int64_t i = 0; i < size; ++i) {
        const BlockId b = gs.table[static_cast<size_t>(i)];
        const bool released = i < gs.num_released_blocks;
        if (released != (b == kNullBlock)) {
          return Internal("KV request {} group {}: slot {} holds block {} but {} released blocks",
                          id, gi, i, b, gs.num_released_blocks);
        }
        if (b == kNullBlock) continue;
        if (b < 0 || b > total) {
          return Internal("KV request {} group {}: slot {} holds invalid block {}", id, gi, i, b);
        }
        ++refs[static_cast<size_t>(b)];
        // Blocks past the committed prefix were taken fresh and never published.
        if (i >= gs.num_committed_blocks && g.pool.hash(b).has_value()) {
          return Internal("KV request {} group {}: uncommitted slot {} holds hashed block {}", id,
                          gi, i, b);
        }
      }
    }
    for (BlockId b = 1; b <= total; ++b) {
      if (g.pool.ref_count(b) != refs[static_cast<size_t>(b)]) {
        return Internal("KV group {} block {}: ref_count {} but {} block-table occurrences", gi, b,
                        g.pool.ref_count(b), refs[static_cast<size_t>(b)]);
      }
    }
  }
  for (const auto& [id, state] : requests_) {
    if (state.num_cached_tokens < 0 || !Aligned(state.num_cached_tokens)) {
      return Internal("KV request {}: {} cached tokens is not a block boundary of every group", id,
                      state.num_cached_tokens);
    }
    const bool replay = state.replay_start != state.num_cached_tokens;
    if (replay && (spec_.replay_tokens == 0 || state.replay_start < 0 ||
                   state.replay_start > ReplayStartFor(state.num_cached_tokens) ||
                   state.replay_start % window_alignment_ != 0)) {
      return Internal("KV request {}: replay from {} for a hit of {} tokens (replay bound {})", id,
                      state.replay_start, state.num_cached_tokens, spec_.replay_tokens);
    }
  }
  if (prefix_hits_ < 0 || prefix_hits_ > prefix_queries_ || prefix_replayed_ < 0 ||
      prefix_replayed_ > prefix_hits_) {
    return Internal("KV prefix stats: {} hits ({} replayed) out of {} queried tokens", prefix_hits_,
                    prefix_replayed_, prefix_queries_);
  }
  return OkStatus();
}

}  // namespace dinfer::kv
