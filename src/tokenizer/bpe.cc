#include "tokenizer/bpe.h"

#include <algorithm>
#include <functional>

#include <fmt/format.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace dinfer::tokenizer {
namespace {

struct Symbol {
  int32_t id;
  int32_t prev;  // index of the previous live symbol, or -1
  int32_t next;  // index of the next live symbol, or -1
  bool alive;
};

struct Candidate {
  int32_t rank;
  int32_t pos;  // index of the left symbol
  int32_t id;   // the token the merge makes
};

// std heap functions build max-heaps: "greater" puts the lowest rank, then leftmost, on top.
bool Later(const Candidate& a, const Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    const std::vector<std::pair<std::string, int32_t>>& vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  int32_t limit = 0;
  for (const auto& [token, id] : vocab) {
    if (id < 0) return DataLoss("token '{}' has negative id {}", token, id);
    limit = std::max(limit, id + 1);
  }
  model->id_to_token_.resize(static_cast<size_t>(limit));
  model->token_to_id_.reserve(vocab.size());
  for (const auto& [token, id] : vocab) {
    model->id_to_token_[static_cast<size_t>(id)] = token;
    model->token_to_id_.emplace(token, id);
  }

  model->merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    joined = a;
    joined += b;
    const std::optional<int32_t> id_a = model->TokenToId(a), id_b = model->TokenToId(b),
                                 id_ab = model->TokenToId(joined);
    if (!id_a || !id_b || !id_ab) {
      if (options.skip_invalid_merges) continue;
      return DataLoss("merge {} ('{} {}') names a token that is not in the vocabulary", rank, a, b);
    }
    // A repeated pair keeps its last rank, as HF's merge map does.
    model->merges_[PairKey(*id_a, *id_b)] = {static_cast<int32_t>(rank), *id_ab};
  }

  std::string spelled;
  for (int b = 0; b < 256; ++b) {
    spelled.clear();
    AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &spelled);
    model->byte_ids_[b] = model->TokenToId(spelled).value_or(-1);
    model->fallback_ids_[b] = model->TokenToId(fmt::format("<0x{:02X}>", b)).value_or(-1);
  }
  if (options.unk_token) model->unk_id_ = model->TokenToId(*options.unk_token);
  model->options_ = std::move(options);
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeModel::IdToToken(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || id >= id_limit()) return kEmpty;
  return id_to_token_[static_cast<size_t>(id)];
}

void BpeModel::Encode(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (piece.size() > kMaxCachedPieceBytes) {
    EncodeUncached(piece, out);
    return;
  }
  const size_t hash = StringHash()(piece);
  CacheShard& shard = cache_[hash % kCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.words.find(piece);
    if (it != shard.words.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out->size();
  EncodeUncached(piece, out);
  std::vector<int32_t> ids(out->begin() + static_cast<ptrdiff_t>(first), out->end());
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.words.size() >= kCacheEntriesPerShard) shard.words.clear();
  shard.words.emplace(std::string(piece), std::move(ids));
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const {
  symbols->clear();
  int32_t pending_unk = -1;
  auto unknown = [&]() {
    if (!unk_id_) return;
    if (pending_unk >= 0 && !options_.fuse_unk) symbols->push_back(pending_unk);
    pending_unk = *unk_id_;
  };
  auto known = [&](int32_t id) {
    if (pending_unk >= 0) symbols->push_back(pending_unk);
    pending_unk = -1;
    symbols->push_back(id);
  };
  auto fallback = [&](std::string_view bytes) {
    if (!options_.byte_fallback) return false;
    for (char c : bytes) {
      if (fallback_ids_[static_cast<uint8_t>(c)] < 0) return false;
    }
    for (char c : bytes) symbols->push_back(fallback_ids_[static_cast<uint8_t>(c)]);
    return true;
  };
  if (options_.byte_level) {
    for (size_t i = 0; i < word.size(); ++i) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(word[i])];
      if (id >= 0) {
        known(id);
      } else if (!fallback(word.substr(i, 1))) {
        unknown();
      }
    }
  } else {
    for (size_t pos = 0; pos < word.size();) {
      const size_t length = DecodeUtf8(word, pos).length;
      const std::string_view ch = word.substr(pos, length);
      pos += length;
      if (const std::optional<int32_t> id = TokenToId(ch)) {
        known(*id);
      } else if (!fallback(ch)) {
        unknown();
      }
    }
  }
  if (pending_unk >= 0) symbols->push_back(pending_unk);
}

void BpeModel::EncodeUncached(std::string_view piece, std::vector<int32_t>* out) const {
  if (options_.ignore_merges) {
    std::optional<int32_t> whole;
    if (options_.byte_level) {
      thread_local std::string spelled;
      spelled.clear();
      AppendByteLevel(piece, &spelled);
      whole = TokenToId(spelled);
    } else {
      whole = TokenToId(piece);
    }
    if (whole) {
      out->push_back(*whole);
      return;
    }
  }

  thread_local std::vector<int32_t> ids;
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> queue;
  InitialSymbols(piece, &ids);
  if (ids.size() <= 1) {
    out->insert(out->end(), ids.begin(), ids.end());
    return;
  }
  const auto n = static_cast<int32_t>(ids.size());
  symbols.resize(ids.size());
  queue.clear();
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};
    if (i + 1 < n) {
      auto it = merges_.find(PairKey(ids[i], ids[i + 1]));
      if (it != merges_.end()) queue.push_back({it->second.rank, i, it->second.id});
    }
  }
  std::make_heap(queue.begin(), queue.end(), Later);
  auto push = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    queue.push_back({it->second.rank, left, it->second.id});
    std::push_heap(queue.begin(), queue.end(), Later);
  };
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), Later);
    const Candidate top = queue.back();
    queue.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // A candidate is stale when either side has changed since it was queued.
    auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.id != top.id) continue;
    left.id = top.id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    if (left.next >= 0) push(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
}

}  // namespace dinfer::tokenizer
