// TokenIndex: a tokenizer's vocabulary as grammar matching needs it: each token's bytes, the stop
// tokens, and a trie of all matchable tokens stored in depth-first preorder (a node's subtree is
// the contiguous range up to its subtree_end), so that walking it with an automaton skips whole
// subtrees at the first rejected byte. Special tokens and tokens without bytes are left out: a
// grammar never allows them (stop tokens are allowed where the grammar may end). Immutable after
// construction; share one per tokenizer across threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dinfer::structured {

class TokenIndex {
 public:
  struct Node {
    uint8_t byte = 0;
    uint16_t depth = 0;       // bytes from the root; the root has depth 0
    int32_t subtree_end = 0;  // first node after this node's subtree
    int32_t tok_begin = 0;    // tokens ending exactly here: sorted_[tok_begin, tok_end)
    int32_t tok_end = 0;
    int32_t sub_tok_end = 0;  // tokens in the subtree: sorted_[tok_begin, sub_tok_end)
  };

  // `stop_ids` end generation where the grammar may end (the tokenizer's eos ids when empty).
  static std::shared_ptr<const TokenIndex> FromTokenizer(const tokenizer::Tokenizer& tokenizer,
                                                         std::vector<int32_t> stop_ids = {});
  // For tests and callers with their own vocabularies: token i has bytes tokens[i]; `excluded`
  // ids (special tokens) are never matched.
  static std::shared_ptr<const TokenIndex> FromTokens(std::vector<std::string> tokens,
                                                      std::vector<int32_t> stop_ids,
                                                      const std::vector<int32_t>& excluded = {});

  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  // The matchable token whose bytes are exactly `b`, or -1.
  int32_t single_byte_token(uint8_t b) const { return single_byte_[b]; }
  bool IsStop(int32_t id) const;
  // Whether the grammar can match the token's bytes (special tokens and empty tokens: never).
  bool matchable(int32_t id) const { return matchable_[id] != 0; }
  const std::vector<Node>& nodes() const { return nodes_; }
  // The nodes at depth 1 (one per first byte), in byte order.
  const std::vector<int32_t>& root_children() const { return root_children_; }
  // Token ids in byte order; nodes index into this.
  const std::vector<int32_t>& sorted() const { return sorted_; }
  int32_t max_token_bytes() const { return max_token_bytes_; }

 private:
  void Build(const std::vector<uint8_t>& excluded);

  std::vector<std::string> bytes_;
  std::vector<int32_t> stop_ids_;
  std::vector<uint8_t> matchable_;
  std::vector<Node> nodes_;
  std::vector<int32_t> root_children_;
  std::array<int32_t, 256> single_byte_{};
  std::vector<int32_t> sorted_;
  int32_t max_token_bytes_ = 0;
};

// Bitmask helpers: bit i of word i / 32 is token i.
inline int32_t BitmaskWords(int32_t vocab_size) { return (vocab_size + 31) / 32; }
inline void SetBit(uint32_t* mask, int32_t id) { mask[id >> 5] |= 1u << (id & 31); }
inline bool TestBit(const uint32_t* mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1u; }

}  // namespace dinfer::structured
