// Randomized KvCacheManager test: thousands of scheduler-like operations on tiny pools, with
// CheckInvariants after each and an oracle of what every block's KV holds (per KV group), so that a
// prefix hit on stale, partial or foreign KV is caught, as is a write into a block another request
// reads. Runs with one group (full or sliding window) and with several (a window group next to
// compressed groups whose blocks hold a row per `entry_rate` tokens), also with SWA bounded replay
// (a replaying request rewrites only its fresh window blocks).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kv/kv_cache_manager.h"

namespace dinfer::kv {
namespace {

// What a full block's KV encodes: the salt and every token up to the block's end.
struct Content {
  uint64_t salt = 0;
  std::vector<int32_t> prefix;
  bool operator==(const Content&) const = default;
};

struct SimRequest {
  std::vector<int32_t> tokens;  // prompt, then the tokens it will generate
  int64_t prompt_len = 0;
  uint64_t salt = 0;
  bool running = false;
  PrefixHit matched;     // last Match result (may be stale when used)
  int64_t cached = 0;    // tokens reused at admission (T; a replay computed from before it)
  int64_t start = 0;     // where its computation started at admission
  int64_t computed = 0;  // tokens whose KV is written
  int64_t allocated = 0;
};

struct Coverage {
  int64_t reused_blocks = 0;
  int64_t refused = 0;
  int64_t released = 0;
  int64_t finished = 0;
  int64_t replays = 0;
};

class Stress {
 public:
  Stress(const KvCacheSpec& spec, uint32_t seed) : spec_(spec), kv_(spec), rng_(seed) {
    for (int64_t g = 0; g < spec.num_groups(); ++g) {
      groups_.push_back(spec.group(g));
      shadow_.emplace_back(static_cast<size_t>(groups_.back().num_blocks));
    }
    // A few long bases, so that prompts often share prefixes.
    for (int b = 0; b < 3; ++b) {
      std::vector<int32_t> base(24);
      for (int32_t& t : base) t = Uniform(0, 3);
      bases_.push_back(std::move(base));
    }
  }

  void Run(int num_ops, Coverage& cov) {
    for (int op = 0; op < num_ops; ++op) {
      SCOPED_TRACE(fmt::format("op {}", op));
      Step(cov);
      if (::testing::Test::HasFatalFailure()) return;
      const Status st = kv_.CheckInvariants();
      ASSERT_TRUE(st.ok()) << st.ToString();
      const KvCacheStats s = kv_.Stats();
      ASSERT_EQ(s.free + s.cached + s.in_use, s.total);
      for (const auto& [id, r] : reqs_) {
        for (size_t g = 0; g < groups_.size(); ++g) {
          // A replay's other groups hold the hit's blocks even beyond what it allocated.
          const int64_t reused = groups_[g].sliding_window > 0 ? 0 : FullBlocks(g, r.cached);
          ASSERT_EQ(static_cast<int64_t>(kv_.BlockTable(id, g).size()),
                    r.running ? std::max(BlocksFor(g, r.allocated), reused) : 0)
              << "request " << id << " group " << g;
        }
      }
    }
  }

 private:
  int32_t Uniform(int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng_);
  }
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  int64_t RowsPerBlock(size_t g) const { return groups_[g].block_size / groups_[g].entry_rate; }
  // Blocks of group g holding rows of the first n tokens.
  int64_t BlocksFor(size_t g, int64_t n) const {
    return (n / groups_[g].entry_rate + RowsPerBlock(g) - 1) / RowsPerBlock(g);
  }
  int64_t FullBlocks(size_t g, int64_t n) const {
    return n / groups_[g].entry_rate / RowsPerBlock(g);
  }
  int64_t Dead(size_t g, int64_t next) const {
    const int64_t w = groups_[g].sliding_window;
    return w == 0 ? 0 : std::max<int64_t>(0, next - w + 1) / groups_[g].block_size;
  }

  std::span<const int32_t> Prompt(const SimRequest& r) const {
    return {r.tokens.data(), static_cast<size_t>(r.prompt_len)};
  }

  std::string Snapshot() const {
    const KvCacheStats s = kv_.Stats();
    std::string out = fmt::format("{} {} {};", s.free, s.cached, s.in_use);
    for (const auto& [id, r] : reqs_) {
      for (size_t g = 0; g < groups_.size(); ++g) {
        out += fmt::format(" {}/{}:{}", id, g, kv_.BlockTable(id, g));
      }
    }
    return out;
  }

  // Whether `block` of group g is in the table of a running request other than `self`.
  bool HeldByOther(size_t g, RequestId self, BlockId block) const {
    for (const auto& [id, r] : reqs_) {
      if (id == self || !r.running) continue;
      for (BlockId b : kv_.BlockTable(id, g)) {
        if (b == block) return true;
      }
    }
    return false;
  }

  RequestId Pick(bool running) {
    std::vector<RequestId> ids;
    for (const auto& [id, r] : reqs_) {
      if (r.running == running) ids.push_back(id);
    }
    if (ids.empty()) return -1;
    return ids[static_cast<size_t>(Uniform(0, static_cast<int32_t>(ids.size()) - 1))];
  }

  void NewRequest() {
    SimRequest r;
    const auto& base = bases_[static_cast<size_t>(Uniform(0, 2))];
    r.tokens.assign(base.begin(), base.begin() + Uniform(1, 24));
    for (int i = Uniform(0, 6); i > 0; --i) r.tokens.push_back(Uniform(0, 3));
    r.prompt_len = static_cast<int64_t>(r.tokens.size());
    for (int i = Uniform(0, 12); i > 0; --i) r.tokens.push_back(Uniform(0, 3));
    r.salt = static_cast<uint64_t>(Uniform(0, 1));
    reqs_.emplace(next_id_++, std::move(r));
  }

  // Fresh slots [from[g], table size) of `id`: no other request may hold them; their old KV is
  // gone.
  void TakeFresh(RequestId id, const std::vector<size_t>& from) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      const auto table = kv_.BlockTable(id, g);
      for (size_t i = from[g]; i < table.size(); ++i) {
        ASSERT_NE(table[i], kNullBlock);
        ASSERT_FALSE(HeldByOther(g, id, table[i])) << "fresh block " << table[i] << " is shared";
        shadow_[g][static_cast<size_t>(table[i])].reset();
      }
    }
  }
  std::vector<size_t> TableSizes(RequestId id) const {
    std::vector<size_t> sizes;
    for (size_t g = 0; g < groups_.size(); ++g) sizes.push_back(kv_.BlockTable(id, g).size());
    return sizes;
  }

  // The "device" writes KV for positions [computed, end), then the scheduler commits and releases.
  void Compute(RequestId id, SimRequest& r, int64_t end, Coverage& cov) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      const int64_t bs = groups_[g].block_size, rate = groups_[g].entry_rate;
      const auto table = kv_.BlockTable(id, g);
      // The rows written now: those of positions [computed, end), except a replay's rows outside
      // the window groups (they are the hit's cached blocks).
      const int64_t from =
          groups_[g].sliding_window > 0 ? r.computed : std::max(r.computed, r.cached);
      for (int64_t i = from / rate / RowsPerBlock(g); i < BlocksFor(g, end); ++i) {
        const BlockId b = table[static_cast<size_t>(i)];
        ASSERT_NE(b, kNullBlock) << "writing into a released slot " << i << " of group " << g;
        ASSERT_FALSE(HeldByOther(g, id, b))
            << "writing into block " << b << " of group " << g << " another request reads";
        auto& content = shadow_[g][static_cast<size_t>(b)];
        if ((i + 1) * bs <= end) {
          content = Content{r.salt, {r.tokens.begin(), r.tokens.begin() + (i + 1) * bs}};
        } else {
          content.reset();
        }
      }
    }
    r.computed = end;
    if (Chance(0.85)) kv_.CommitComputed(id, r.tokens, r.computed);
    if (Chance(0.9)) {
      const auto before = kv_.Stats();
      kv_.ReleaseOutsideWindow(id, r.computed);
      if (kv_.Stats().in_use < before.in_use) ++cov.released;
      for (size_t g = 0; g < groups_.size(); ++g) {
        const int64_t dead = Dead(g, r.computed);
        const auto after = kv_.BlockTable(id, g);
        // A replay's window slots before its start hold nothing either.
        const int64_t empty =
            std::max(dead, r.cached > r.start ? r.start / groups_[g].block_size : 0);
        for (int64_t i = 0; i < static_cast<int64_t>(after.size()); ++i) {
          if (i < (groups_[g].sliding_window > 0 ? empty : dead)) {
            ASSERT_EQ(after[static_cast<size_t>(i)], kNullBlock) << "dead slot " << i << " kept";
          } else {
            ASSERT_NE(after[static_cast<size_t>(i)], kNullBlock)
                << "live slot " << i << " of group " << g << " released";
          }
        }
      }
    }
  }

  void Admit(RequestId id, SimRequest& r, bool fresh_match, Coverage& cov) {
    const int64_t bs = spec_.block_size;
    const int64_t chunk = Uniform(1, 16);
    const int64_t total = std::min(r.prompt_len, r.matched.replay_start + chunk);
    const int64_t hit = r.matched.num_cached_tokens;
    const auto prompt = Prompt(r);
    const bool can = kv_.CanAllocate(id, total, hit, prompt, r.salt);
    const std::string before = Snapshot();
    const bool ok = kv_.Allocate(id, total, prompt, r.salt, hit);
    ASSERT_EQ(can, ok);
    if (!ok) {
      ASSERT_EQ(Snapshot(), before);
      ++cov.refused;
      return;
    }
    const int64_t cached = kv_.NumCachedTokens(id), start = kv_.ReplayStart(id);
    ASSERT_EQ(cached % bs, 0);
    ASSERT_LE(cached, hit);
    ASSERT_LT(cached, r.prompt_len);
    ASSERT_LE(start, std::min(cached, total));
    if (start < cached) {
      ASSERT_GT(spec_.replay_tokens, 0);
      ASSERT_EQ(start, std::max<int64_t>(0, cached - spec_.replay_tokens) / bs * bs);
      ++cov.replays;
    }
    if (fresh_match) {
      ASSERT_EQ(cached, hit) << "nothing changed since Match";
      ASSERT_EQ(start, r.matched.replay_start);
    }
    std::vector<size_t> reused(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      const bool window = groups_[g].sliding_window > 0;
      const auto table = kv_.BlockTable(id, g);
      // A replay's window groups start over at `start`, the others keep the hit's blocks.
      const int64_t upto = window ? start : cached;
      ASSERT_EQ(static_cast<int64_t>(table.size()),
                std::max(BlocksFor(g, total), window ? 0 : FullBlocks(g, cached)));
      // The reused rows must end on a block boundary: a shared block is never written again.
      ASSERT_EQ((upto / groups_[g].entry_rate) % RowsPerBlock(g), 0) << "group " << g;
      const int64_t full = FullBlocks(g, upto);
      const int64_t gbs = groups_[g].block_size;
      for (int64_t i = 0; i < full; ++i) {
        const BlockId b = table[static_cast<size_t>(i)];
        if (i < Dead(g, cached) || (window && start < cached)) {
          ASSERT_EQ(b, kNullBlock) << "group " << g << ": slot " << i << " behind the window";
          continue;
        }
        const auto& content = shadow_[g][static_cast<size_t>(b)];
        const Content want{r.salt, {r.tokens.begin(), r.tokens.begin() + (i + 1) * gbs}};
        ASSERT_TRUE(content.has_value() && *content == want)
            << "group " << g << " prefix block " << i << " (block " << b << ") holds other KV";
        ++cov.reused_blocks;
      }
      reused[g] = static_cast<size_t>(full);
    }
    TakeFresh(id, reused);
    r.running = true;
    r.allocated = total;
    r.cached = cached;
    r.start = start;
    r.computed = start;
    Compute(id, r, total, cov);
  }

  void Grow(RequestId id, SimRequest& r, Coverage& cov) {
    const int64_t len = static_cast<int64_t>(r.tokens.size());
    if (r.computed == len) {
      kv_.Free(id);
      reqs_.erase(id);
      ++cov.finished;
      return;
    }
    // Chunked prefill, then one token per decode step.
    const int64_t n = r.computed < r.prompt_len ? Uniform(1, 8) : 1;
    const int64_t total = std::min(len, r.computed + n);
    const std::vector<size_t> old_size = TableSizes(id);
    const bool can = kv_.CanAllocate(id, total);
    const std::string before = Snapshot();
    const bool ok = kv_.Allocate(id, total);
    ASSERT_EQ(can, ok);
    if (!ok) {
      ASSERT_EQ(Snapshot(), before);
      ++cov.refused;
      // Preempt a random running request (maybe this one); it starts over from the waiting list.
      const RequestId victim = Pick(true);
      SimRequest& v = reqs_.at(victim);
      kv_.Free(victim);
      v.running = false;
      v.computed = v.allocated = v.cached = v.start = 0;
      v.matched = {};
      return;
    }
    TakeFresh(id, old_size);
    r.allocated = std::max(r.allocated, total);
    Compute(id, r, total, cov);
  }

  void Step(Coverage& cov) {
    const int dice = Uniform(0, 99);
    if (dice < 15) {
      if (reqs_.size() < 8) NewRequest();
    } else if (dice < 35) {
      const RequestId id = Pick(false);
      if (id < 0) return;
      SimRequest& r = reqs_.at(id);
      // Usually Match right before Allocate; sometimes reuse an older, possibly stale, result.
      const bool fresh = Chance(0.7);
      if (fresh) r.matched = kv_.Match(Prompt(r), r.salt);
      Admit(id, r, fresh, cov);
    } else if (dice < 40) {
      const RequestId id = Pick(false);
      if (id < 0) return;
      SimRequest& r = reqs_.at(id);
      r.matched = kv_.Match(Prompt(r), r.salt);
      const int64_t bs = spec_.block_size;
      ASSERT_EQ(r.matched.num_cached_tokens % bs, 0);
      ASSERT_EQ(r.matched.replay_start % bs, 0);
      ASSERT_LE(r.matched.replay_start, r.matched.num_cached_tokens);
      ASSERT_LE(r.matched.num_cached_tokens, std::max<int64_t>(0, r.prompt_len - 1));
      if (!spec_.enable_prefix_caching) {
        ASSERT_EQ(r.matched.num_cached_tokens, 0);
      }
    } else if (dice < 85) {
      const RequestId id = Pick(true);
      if (id < 0) return;
      Grow(id, reqs_.at(id), cov);
    } else if (dice < 92) {
      const RequestId id = Pick(true);
      if (id < 0) return;
      const SimRequest& r = reqs_.at(id);
      kv_.CommitComputed(id, r.tokens, r.computed);
    } else {
      // Abort: running or waiting (Free of a request without blocks is a no-op).
      const RequestId id = Pick(Chance(0.7));
      if (id < 0) return;
      kv_.Free(id);
      reqs_.erase(id);
    }
  }

  KvCacheSpec spec_;
  KvCacheManager kv_;
  std::mt19937 rng_;
  std::vector<KvGroupSpec> groups_;
  // Per group, by block id; empty: partial or garbage.
  std::vector<std::vector<std::optional<Content>>> shadow_;
  std::vector<std::vector<int32_t>> bases_;
  std::map<RequestId, SimRequest> reqs_;
  RequestId next_id_ = 1;
};

TEST(KvCacheManagerStress, RandomOperationsKeepInvariants) {
  Coverage cov;
  uint32_t seed = 1;
  for (int64_t block_size : {1, 2, 4}) {
    for (int64_t num_blocks : {4, 7, 13}) {
      for (int64_t window : {0, 3, 9}) {
        for (bool caching : {true, false}) {
          KvCacheSpec spec;
          spec.num_blocks = num_blocks;
          spec.block_size = block_size;
          spec.sliding_window = window;
          spec.enable_prefix_caching = caching;
          SCOPED_TRACE(fmt::format("block_size {} num_blocks {} window {} caching {} seed {}",
                                   block_size, num_blocks, window, caching, seed));
          Stress stress(spec, seed++);
          stress.Run(2000, cov);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  // The run must have exercised what it checks.
  EXPECT_GT(cov.reused_blocks, 1000);
  EXPECT_GT(cov.refused, 100);
  EXPECT_GT(cov.released, 100);
  EXPECT_GT(cov.finished, 100);
  RecordProperty("reused_blocks", std::to_string(cov.reused_blocks));
}

// A window group of blocks of `block_size` next to compressed groups (rows every 2 and every 8
// tokens), as DeepSeek-V4's layers keep their KV.
TEST(KvCacheManagerStress, SeveralGroupsKeepInvariants) {
  Coverage cov;
  uint32_t seed = 100;
  for (int64_t block_size : {2, 4}) {
    for (int64_t num_blocks : {5, 9, 17}) {
      for (int64_t window : {0, 3, 9}) {
        for (int64_t replay : {0, 6}) {
          for (bool caching : {true, false}) {
            if (window == 0 && replay > 0) continue;
            KvCacheSpec spec;
            spec.num_blocks = num_blocks;
            spec.block_size = block_size;
            spec.sliding_window = window;
            spec.enable_prefix_caching = caching;
            spec.replay_tokens = replay;
            // Rate 2 in blocks of 2 * block_size tokens (so a prefix of whole window blocks may end
            // a rate-2 block half way); rate 8 in blocks of 8 tokens (one row).
            spec.extra_groups.push_back({num_blocks, 2 * block_size, 0, 2});
            spec.extra_groups.push_back({num_blocks, 8, 0, 8});
            SCOPED_TRACE(
                fmt::format("block_size {} num_blocks {} window {} replay {} caching {} seed {}",
                            block_size, num_blocks, window, replay, caching, seed));
            Stress stress(spec, seed++);
            stress.Run(2000, cov);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
  EXPECT_GT(cov.reused_blocks, 1000);
  EXPECT_GT(cov.refused, 100);
  EXPECT_GT(cov.released, 100);
  EXPECT_GT(cov.finished, 100);
  EXPECT_GT(cov.replays, 100);
  RecordProperty("replays", std::to_string(cov.replays));
}

}  // namespace
}  // namespace dinfer::kv
