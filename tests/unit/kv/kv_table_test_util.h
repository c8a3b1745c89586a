// Table-driven KvCacheManager tests: each row is one action on one request and the expected state
// after it (free/cached/in use counts and block tables). The runner checks CheckInvariants after
// every row and that a refused Allocate changed nothing. Test-only; not thread-safe.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kv/kv_cache_manager.h"

namespace dinfer::kv::testing {

// Distinct tokens first, first + 1, ..., first + n - 1.
inline std::vector<int32_t> Seq(int32_t first, int64_t n) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = first + static_cast<int32_t>(i);
  return out;
}

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A request of the table: its whole token sequence (prompt, then the tokens it will generate).
struct Req {
  RequestId id = 0;
  std::vector<int32_t> tokens;
  int64_t prompt_len = 0;
  uint64_t salt = 0;
};

enum class Op {
  kMatch,     // Match(prompt, salt); the result feeds the request's next first Allocate
  kAllocate,  // Allocate(id, arg, prompt, salt, last Match result)
  kCommit,    // CommitComputed(id, tokens, arg)
  kRelease,   // ReleaseOutsideWindow(id, arg)
  kFree,      // Free(id)
};

inline constexpr int64_t kAny = -1;      // result not checked
inline constexpr int64_t kRefused = -2;  // Allocate must return false

struct Counts {
  int64_t free = 0;
  int64_t cached = 0;
  int64_t in_use = 0;
};

struct Row {
  Op op;
  RequestId id;
  int64_t arg = 0;
  // Match: the cached tokens it returns. Allocate: NumCachedTokens after success, or kRefused.
  int64_t want = kAny;
  Counts counts;
  // Block tables after the row, of the listed requests only ({} for a request with none).
  std::vector<std::pair<RequestId, std::vector<BlockId>>> tables = {};
};

inline const char* OpName(Op op) {
  switch (op) {
    case Op::kMatch:
      return "Match";
    case Op::kAllocate:
      return "Allocate";
    case Op::kCommit:
      return "Commit";
    case Op::kRelease:
      return "Release";
    case Op::kFree:
      return "Free";
  }
  return "?";
}

class TableRunner {
 public:
  TableRunner(const KvCacheSpec& spec, std::vector<Req> reqs) : kv_(spec) {
    for (Req& r : reqs) reqs_.emplace(r.id, std::move(r));
  }

  KvCacheManager& kv() { return kv_; }

  void Run(const std::vector<Row>& rows) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& row = rows[i];
      SCOPED_TRACE(fmt::format("row {}: {}(request {}, {})", i, OpName(row.op), row.id, row.arg));
      Apply(row);
      if (::testing::Test::HasFatalFailure()) return;
      const Status st = kv_.CheckInvariants();
      ASSERT_TRUE(st.ok()) << st.ToString();
      const KvCacheStats s = kv_.Stats();
      EXPECT_EQ(s.free, row.counts.free) << "free";
      EXPECT_EQ(s.cached, row.counts.cached) << "cached";
      EXPECT_EQ(s.in_use, row.counts.in_use) << "in use";
      for (const auto& [id, want] : row.tables) {
        const auto got = kv_.BlockTable(id);
        EXPECT_EQ(std::vector<BlockId>(got.begin(), got.end()), want) << "table of request " << id;
      }
    }
  }

 private:
  // Stats and every known request's table: what a refused Allocate must leave untouched.
  std::string Snapshot() const {
    const KvCacheStats s = kv_.Stats();
    std::string out = fmt::format("free {} cached {} in_use {};", s.free, s.cached, s.in_use);
    for (const auto& [id, r] : reqs_) {
      for (int64_t g = 0; g < kv_.num_groups(); ++g) {
        out += fmt::format(" {}/{}:{}", id, g, kv_.BlockTable(id, g));
      }
    }
    return out;
  }

  void Apply(const Row& row) {
    auto it = reqs_.find(row.id);
    ASSERT_NE(it, reqs_.end()) << "unknown request in the table";
    const Req& r = it->second;
    const std::span<const int32_t> prompt(r.tokens.data(), static_cast<size_t>(r.prompt_len));
    switch (row.op) {
      case Op::kMatch: {
        const int64_t got = kv_.Match(prompt, r.salt).num_cached_tokens;
        matched_[r.id] = got;
        if (row.want != kAny) {
          EXPECT_EQ(got, row.want) << "Match result";
        }
        break;
      }
      case Op::kAllocate: {
        const int64_t cached = matched_.count(r.id) ? matched_[r.id] : 0;
        const bool can = kv_.CanAllocate(r.id, row.arg, cached, prompt, r.salt);
        const std::string before = Snapshot();
        const bool ok = kv_.Allocate(r.id, row.arg, prompt, r.salt, cached);
        EXPECT_EQ(can, ok) << "CanAllocate disagrees with Allocate";
        if (!ok) {
          EXPECT_EQ(Snapshot(), before) << "a refused Allocate changed the state";
        }
        if (row.want == kRefused) {
          EXPECT_FALSE(ok) << "Allocate should be refused";
        } else if (row.want != kAny) {
          EXPECT_TRUE(ok) << "Allocate refused";
          EXPECT_EQ(kv_.NumCachedTokens(r.id), row.want) << "NumCachedTokens";
        }
        break;
      }
      case Op::kCommit:
        kv_.CommitComputed(r.id, r.tokens, row.arg);
        break;
      case Op::kRelease:
        kv_.ReleaseOutsideWindow(r.id, row.arg);
        break;
      case Op::kFree:
        kv_.Free(r.id);
        matched_.erase(r.id);
        break;
    }
  }

  KvCacheManager kv_;
  std::map<RequestId, Req> reqs_;
  std::map<RequestId, int64_t> matched_;
};

}  // namespace dinfer::kv::testing
