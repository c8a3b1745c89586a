// KV cache block management, host-side metadata only (no tensors): per KV group (layers whose
// KV has the same granularity: full attention, a sliding window, compressed entries) a BlockPool
// of fixed-size blocks with reference counts and a null block, a hash-chained prefix index of full
// blocks (salted per tenant) with LRU eviction of unreferenced cached blocks; the KvCacheManager
// gives each request one block table per group.
//
// Every change is two-phase: CanAllocate() plans without side effects, Allocate() commits, and a
// failed Allocate() changes nothing (in any group). Invariant (CheckInvariants), per group:
// free + cached + in use = total. Sliding-window groups release blocks that no future token can
// attend to; when the model can rebuild them (KvCacheSpec::replay_tokens), a prefix whose other
// groups are cached hits without them and the request recomputes a bounded stretch of tokens
// before the hit (SWA bounded replay). Not thread-safe: owned and called by the scheduler thread
// only.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/block_pool.h"  // BlockId, BlockHash, kNullBlock

namespace dinfer::kv {

using RequestId = int64_t;

// One KV group: its own block pool, block size and window.
struct KvGroupSpec {
  int64_t num_blocks = 0;      // including the null block
  int64_t block_size = 16;     // tokens a block covers
  int64_t sliding_window = 0;  // 0: full attention; else tokens a query can see (itself included)
  // Tokens per row: a block holds block_size / entry_rate rows and row k of the sequence is
  // written when token (k + 1) * entry_rate - 1 is computed (compressed KV: one entry per
  // entry_rate tokens). A block is needed once its first row is written and is full (committable,
  // shareable) once its last row is. 1: a row per token. Must divide block_size.
  int64_t entry_rate = 1;
};

// Group 0 is described by the top-level fields (a model with one KV group needs nothing else);
// models whose layers keep KV at several granularities add `extra_groups`. Group 0 must have
// entry_rate 1 (prefix hits are whole blocks of it).
struct KvCacheSpec {
  int64_t num_blocks = 0;  // including the null block
  int64_t block_size = 16;
  int64_t sliding_window = 0;  // 0: full attention; else tokens a query can see (itself included)
  bool enable_prefix_caching = true;
  std::vector<KvGroupSpec> extra_groups = {};
  // SWA bounded replay. 0: a prefix hit needs the blocks its sliding-window groups still read.
  // R > 0: the model rebuilds those exactly by recomputing the R tokens before the hit (its window
  // receptive field, Model::WindowReplayTokens), so a prefix of T tokens whose other groups are
  // cached also hits without them: the request recomputes [S, T), S = T - R rounded down to whole
  // blocks of every window group, writing only window-group rows for those positions (the other
  // groups' rows are shared cached blocks), and computes on from T. Only for specs with both
  // sliding-window groups and others (those anchor the hit in the cache).
  int64_t replay_tokens = 0;

  int64_t num_groups() const { return 1 + static_cast<int64_t>(extra_groups.size()); }
  KvGroupSpec group(int64_t g) const;
};

struct KvCacheStats {
  int64_t total = 0;   // allocatable blocks (num_blocks - 1), summed over the groups
  int64_t free = 0;    // on the free list, holding nothing reusable
  int64_t cached = 0;  // unreferenced but holding a cached full block (evictable, LRU)
  int64_t in_use = 0;  // referenced by at least one request
  double usage = 0;    // in_use / total of the fullest group
  // Counted when a request is admitted (its first Allocate with tokens): its tokens, and of
  // those the cached ones it reuses.
  int64_t prefix_queries = 0;
  int64_t prefix_hits = 0;
  // Of the hits, tokens recomputed to rebuild sliding-window KV (bounded replay).
  int64_t prefix_replayed = 0;
};

// A prefix hit: the first num_cached_tokens (T) tokens' KV comes from the cache, and computation
// starts at replay_start (S <= T). S < T only for a bounded replay: positions [S, T) are computed
// again to rebuild the sliding-window groups' blocks, and their other groups' rows are cached.
struct PrefixHit {
  int64_t num_cached_tokens = 0;
  int64_t replay_start = 0;
  int64_t num_replay_tokens() const { return num_cached_tokens - replay_start; }
  bool operator==(const PrefixHit&) const = default;
};

// The hash of a full block: its tokens, its parent block's hash (0 for the first) and the salt.
// XXH3-64: equal inputs give equal hashes in every process on the same (little-endian) machine.
BlockHash HashBlock(BlockHash parent, std::span<const int32_t> tokens, uint64_t salt);

// Typical use per step: a waiting request calls Match (hit {T, S}) then Allocate(id, S + n, prompt,
// salt, T) and starts computing at ReplayStart(id) (which can be below S: blocks may have been
// evicted since Match); a running one calls Allocate(id, computed + n). After the step:
// CommitComputed, then ReleaseOutsideWindow; Free when it finishes or is preempted. Each group has
// its own pool, so every operation applies to every group; a prefix hit counts only where every
// group has the blocks it needs.
class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheSpec& spec);

  const KvCacheSpec& spec() const { return spec_; }

  // Longest cached prefix of `tokens` in whole blocks of group 0, leaving at least one token to
  // compute (so at most tokens.size() - 1 tokens); the blocks are not yet taken:
  // Allocate(..., hit.num_cached_tokens) takes them. With prefix caching disabled: {0, 0}. A
  // prefix of T tokens hits when every group has it: full-attention and compressed groups every
  // block holding rows of the first T tokens (which must be full blocks), sliding-window groups
  // only the blocks the window still reads from position T on. With replay_tokens, the longest
  // prefix the other groups hold hits too, with S = T - replay_tokens (rounded down to window
  // blocks), when that saves work: S beats the longest plain hit.
  PrefixHit Match(std::span<const int32_t> tokens, uint64_t salt) const;

  // Blocks Allocate would take out of group `group`'s free and cached pools for `request` to hold
  // `total_tokens` tokens: new blocks, plus on a first allocation the reused cached blocks that
  // are unreferenced now (taking one shrinks the cached pool as much as a new block does).
  // For a first allocation with `num_cached_tokens` > 0, pass the same `tokens` and `salt` as to
  // Allocate for the exact answer; without them the matched blocks are assumed to be held by
  // other requests (a lower bound), and Allocate stays the authority.
  // Not reduced by blocks a sliding window will release later: call ReleaseOutsideWindow first.
  int64_t BlocksNeeded(RequestId request, int64_t total_tokens, int64_t num_cached_tokens = 0,
                       std::span<const int32_t> tokens = {}, uint64_t salt = 0,
                       int64_t group = 0) const;
  // BlocksNeeded(...) <= free + cached in every group; with `tokens` (or for a running request)
  // exactly when Allocate with the same arguments would succeed.
  bool CanAllocate(RequestId request, int64_t total_tokens, int64_t num_cached_tokens = 0,
                   std::span<const int32_t> tokens = {}, uint64_t salt = 0) const;

  // Grows `request`'s block table of each group to the blocks holding rows of its first
  // `total_tokens` tokens (ceil(total_tokens / block_size) for a row per token; never shrinks).
  // On the request's first call, `tokens` and `salt` name its prompt and up to the first
  // `num_cached_tokens` tokens (a Match result's T) reuse cached blocks: they are re-checked here
  // and reuse stops at the first block no longer cached (evicted since Match), so fewer tokens
  // may be reused; NumCachedTokens(request) then says how many were, and the request must compute
  // from ReplayStart(request). Reuse is also capped like Match (at least one prompt token left to
  // compute, and computation starting at most at total_tokens). A replay hit's window-group
  // tables get fresh blocks from S on (the replay rewrites them), its other groups' tables hold
  // the T tokens' cached blocks even when total_tokens < T. Without `tokens`, nothing is reused. On
  // later calls `tokens`, `salt` and `num_cached_tokens` are ignored; a first call for 0 tokens
  // takes nothing and leaves the request unknown. Returns false and changes nothing when the pool
  // cannot supply the blocks (reused blocks are taken first, so an allocation never evicts its own
  // hits).
  bool Allocate(RequestId request, int64_t total_tokens, std::span<const int32_t> tokens = {},
                uint64_t salt = 0, int64_t num_cached_tokens = 0);

  // Publishes the request's full blocks among its first `num_computed_tokens` tokens (whose KV is
  // now written) in each group's prefix index, continuing the hash chain from its last committed
  // block. `tokens` holds the request's tokens, at least that many (extra ones are ignored). A
  // block whose hash another block already holds stays private (freed normally, never cached). A
  // block a sliding window released before it was committed is not published (its KV is gone),
  // but the chain goes on past it: later blocks hold their own keys. Call CommitComputed before
  // ReleaseOutsideWindow. Unknown requests and disabled prefix caching: no-op.
  void CommitComputed(RequestId request, std::span<const int32_t> tokens,
                      int64_t num_computed_tokens);

  // Sliding window W: a query at position p reads keys p - W < j <= p, and every future query has
  // p >= `next_position`, so keys j <= next_position - W are dead. Drops the request's reference
  // on each block whose positions are all dead and puts kNullBlock in its table slot. A committed
  // block released this way stays cached (its KV is valid, so another request's prompt can still
  // hit it) until evicted. Applies to sliding-window groups; no-op for the others and unknown
  // requests.
  void ReleaseOutsideWindow(RequestId request, int64_t next_position);

  // Drops the request's references, the last block first, so that when the pool runs short the
  // LRU evicts a request's tail blocks before its prefix head. Cached full blocks stay reusable
  // until evicted. Unknown requests: no-op.
  void Free(RequestId request);

  // Group `group`'s table; empty when the request has no blocks. Slot i holds positions
  // [i * block_size, (i + 1) * block_size); released slots hold kNullBlock. Valid until the
  // request's next call here.
  std::span<const BlockId> BlockTable(RequestId request, int64_t group = 0) const;
  int64_t NumCachedTokens(RequestId request) const;  // prefix tokens it reused at admission (T)
  // Where its computation started at admission: NumCachedTokens, or S for a bounded replay.
  int64_t ReplayStart(RequestId request) const;

  // Whether a request of `num_tokens` tokens could ever be held (each full-attention or
  // compressed group has the blocks for it; windows release as they go); ResourceExhausted
  // naming the blocks it needs if not.
  Status CheckCanEverHold(int64_t num_tokens) const;

  int64_t num_groups() const { return static_cast<int64_t>(groups_.size()); }
  KvCacheStats Stats() const;                    // summed over the groups
  KvCacheStats GroupStats(int64_t group) const;  // block counts of one group (no prefix counters)
  double Usage() const;                          // in_use / total of the fullest group
  // Checks free + cached + in use = total, the pool's lists and index, and each block's reference
  // count against its occurrences in the block tables; Internal on the first violation.
  // O(num_blocks + table entries): for tests and debug checks, not per step.
  Status CheckInvariants() const;

 private:
  struct Group {
    KvGroupSpec spec;
    BlockPool pool;
    int64_t rows_per_block = 0;
  };
  struct GroupState {
    std::vector<BlockId> table;
    int64_t num_committed_blocks = 0;  // table[0, n) are in the hash chain
    int64_t num_released_blocks = 0;   // table[0, n) are kNullBlock (sliding window)
    BlockHash last_hash = 0;           // chain hash of block num_committed_blocks - 1; 0: none
  };
  struct RequestState {
    std::vector<GroupState> groups;
    int64_t num_cached_tokens = 0;
    int64_t replay_start = 0;  // == num_cached_tokens unless its hit is a bounded replay
    uint64_t salt = 0;
  };
  // What Allocate would do in one group: the cached blocks a first allocation reuses (kNullBlock
  // for window slots it need not read) and the new ones.
  struct GroupPlan {
    std::vector<BlockId> reused;
    BlockHash last_hash = 0;  // chain hash of the last reused slot
    int64_t num_released = 0;
    int64_t num_new = 0;
    int64_t pool_cost = 0;  // num_new + reused blocks that are cached (unreferenced) now
  };
  struct Plan {
    std::vector<GroupPlan> groups;
    PrefixHit hit;
  };
  // Per group, the cached block (or kNullBlock) and chain hash of each whole block of a prefix.
  struct Lookup {
    std::vector<std::vector<BlockId>> blocks;
    std::vector<std::vector<BlockHash>> hashes;
  };

  // With `tokens`, matched blocks are looked up in the index; without, every matched block (after
  // the caps) is assumed reused and referenced elsewhere (BlocksNeeded's lower bound).
  Plan MakePlan(RequestId request, int64_t total_tokens, std::span<const int32_t> tokens,
                uint64_t salt, int64_t num_cached_tokens) const;
  // The best hit of at most `limit` tokens (see Match), with what it found.
  PrefixHit FindHit(std::span<const int32_t> tokens, uint64_t salt, int64_t limit,
                    Lookup* lookup) const;
  // The replay start for a hit of `n` tokens: n - replay_tokens rounded down to whole blocks of
  // every sliding-window group, at least 0.
  int64_t ReplayStartFor(int64_t n) const;
  // Whether a prefix of `n` tokens is a whole number of group 0 blocks and ends every group's
  // rows on a block boundary.
  bool Aligned(int64_t n) const;
  // Blocks of group `g` holding rows of the first n tokens; of those, the full ones; the ones a
  // sliding window no longer reads once the next position is n.
  int64_t BlocksFor(const Group& g, int64_t n) const;
  int64_t FullBlocks(const Group& g, int64_t n) const;
  int64_t DeadBlocks(const Group& g, int64_t n) const;
  // Whole blocks of group 0 of a `num_tokens`-token prompt that may come from the cache.
  int64_t MaxCachedTokens(int64_t num_tokens) const;

  KvCacheSpec spec_;
  std::vector<Group> groups_;
  std::unordered_map<RequestId, RequestState> requests_;
  int64_t window_alignment_ = 1;  // lcm of the sliding-window groups' block sizes
  bool can_replay_ = false;       // replay_tokens and both window groups and others
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
  int64_t prefix_replayed_ = 0;
};

}  // namespace dinfer::kv
