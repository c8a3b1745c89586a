// AddedVocab: the added tokens of a tokenizer (special tokens like "<|im_start|>", and non-special
// ones) and how text is cut around them before pre-tokenization, as HF `tokenizers` does:
// leftmost-longest matches, with the single_word / lstrip / rstrip rules. Immutable after Create;
// safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "tokenizer/regex.h"

namespace dinfer::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;      // control token: matched only when parsing special tokens
  bool lstrip = false;       // swallows the whitespace before it
  bool rstrip = false;       // swallows the whitespace after it
  bool single_word = false;  // matches only when not inside a word
  bool normalized = false;   // matched against normalized text (else against the raw input)
};

class AddedVocab {
 public:
  // A piece of the text: either an added token (id >= 0) or text to tokenize (id < 0).
  struct Segment {
    size_t begin, end;
    int32_t id;
  };

  static StatusOr<std::unique_ptr<AddedVocab>> Create(std::vector<AddedToken> tokens);

  // Cuts `text` around the tokens matched on raw text (normalized=false) or, with
  // `normalized_pass`, those matched on normalized text. Replaces *out. Special tokens are skipped
  // (left as text) unless `parse_special`.
  void Split(std::string_view text, bool normalized_pass, bool parse_special,
             std::vector<Segment>* out) const;
  bool HasTokens(bool normalized_pass) const { return !tries_[normalized_pass].nodes.empty(); }

  const AddedToken* FindByContent(std::string_view content) const;
  const AddedToken* FindById(int32_t id) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node index
    int32_t token = -1;                                 // index into tokens_ ending here
  };
  struct Trie {
    std::array<int32_t, 256> root;  // first byte -> node index, or -1
    std::vector<Node> nodes;
  };

  AddedVocab() = default;
  void Insert(Trie* trie, std::string_view content, int32_t token);
  // The longest token starting at text[pos]: (index into tokens_, length), or index -1.
  std::pair<int32_t, size_t> LongestAt(const Trie& trie, std::string_view text, size_t pos) const;
  bool IsWordChar(std::string_view text, size_t pos) const;
  bool EndsWithWordChar(std::string_view text) const;

  std::vector<AddedToken> tokens_;
  std::array<Trie, 2> tries_;  // [normalized]
  std::unordered_map<std::string, size_t> by_content_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unique_ptr<Regex> word_char_;  // only when a token is single_word
};

}  // namespace dinfer::tokenizer
