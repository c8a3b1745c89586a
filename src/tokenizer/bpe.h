// BpeModel: the vocabulary and merge ranks of a BPE tokenizer, and the merging of one pre-token
// into token ids (lowest rank first, leftmost first among equals, as HF `tokenizers` does), with a
// per-word cache. Immutable after Create except the cache, which is internally locked: Encode is
// safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dinfer::tokenizer {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  // Pre-tokens are raw bytes spelled in GPT-2's byte-level alphabet before lookup.
  bool byte_level = true;
  // A pre-token that is itself in the vocabulary becomes that token without merging (Llama 3).
  bool ignore_merges = false;
  // A char not in the vocabulary becomes its <0xXX> byte tokens when all of them exist.
  bool byte_fallback = false;
  // Consecutive unknown chars become one unk token.
  bool fuse_unk = false;
  std::optional<std::string> unk_token;
  // Merges naming tokens that are not in the vocabulary are dropped instead of failing (GGUF).
  bool skip_invalid_merges = false;
};

class BpeModel {
 public:
  // `vocab` pairs each token (as the vocabulary spells it) with its id; `merges` are in rank order.
  static StatusOr<std::unique_ptr<BpeModel>> Create(
      const std::vector<std::pair<std::string, int32_t>>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);

  // Appends the ids of one pre-token (raw text; spelled byte-level here when byte_level is set).
  void Encode(std::string_view piece, std::vector<int32_t>* out) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // Ids with no token (holes in the vocabulary) give an empty string.
  const std::string& IdToToken(int32_t id) const;
  // One past the largest id.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct MergeResult {
    int32_t rank;
    int32_t id;
  };
  static constexpr int kCacheShards = 16;
  static constexpr size_t kCacheEntriesPerShard = 8192;
  static constexpr size_t kMaxCachedPieceBytes = 256;
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  };

  BpeModel() = default;
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void EncodeUncached(std::string_view piece, std::vector<int32_t>* out) const;
  void InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const;

  BpeOptions options_;
  StringIdMap token_to_id_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, MergeResult> merges_;
  std::array<int32_t, 256> byte_ids_{};      // byte-level: byte -> id of its char, or -1
  std::array<int32_t, 256> fallback_ids_{};  // byte_fallback: byte -> id of <0xXX>, or -1
  std::optional<int32_t> unk_id_;
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace dinfer::tokenizer
