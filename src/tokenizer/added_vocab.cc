#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace dinfer::tokenizer {
namespace {

// Start of the char that ends at `end` (> 0): back over at most three continuation bytes.
size_t PreviousCharStart(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) {
    --start;
  }
  const Utf8Char ch = DecodeUtf8(text, start);
  return ch.status == Utf8Status::kValid && start + ch.length == end ? start : end - 1;
}

bool WhitespaceAt(std::string_view text, size_t pos, uint32_t* length) {
  const Utf8Char ch = DecodeUtf8(text, pos);
  *length = ch.length;
  return ch.status == Utf8Status::kValid && IsWhitespace(ch.code_point);
}

}  // namespace

StatusOr<std::unique_ptr<AddedVocab>> AddedVocab::Create(std::vector<AddedToken> tokens) {
  std::unique_ptr<AddedVocab> vocab(new AddedVocab());
  for (Trie& trie : vocab->tries_) trie.root.fill(-1);
  vocab->tokens_ = std::move(tokens);
  for (size_t i = 0; i < vocab->tokens_.size(); ++i) {
    const AddedToken& token = vocab->tokens_[i];
    if (token.id < 0) return InvalidArgument("added token '{}' has no id", token.content);
    vocab->by_content_.emplace(token.content, i);
    vocab->by_id_.emplace(token.id, i);
    if (token.content.empty()) continue;
    vocab->Insert(&vocab->tries_[token.normalized], token.content, static_cast<int32_t>(i));
    if (token.single_word && !vocab->word_char_) {
      // HF tests for a word character with the regex crate's Unicode \w; PCRE2 before 10.40
      // lacks the Alphabetic property, so fall back to what it covers of it.
      auto word_char = Regex::Compile(R"(^[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])");
      if (!word_char.ok()) {
        word_char = Regex::Compile(R"(^[\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])");
      }
      DINFER_ASSIGN_OR_RETURN(vocab->word_char_, std::move(word_char));
    }
  }
  return vocab;
}

void AddedVocab::Insert(Trie* trie, std::string_view content, int32_t token) {
  const auto first = static_cast<uint8_t>(content[0]);
  if (trie->root[first] < 0) {
    trie->root[first] = static_cast<int32_t>(trie->nodes.size());
    trie->nodes.emplace_back();
  }
  int32_t node = trie->root[first];
  for (size_t i = 1; i < content.size(); ++i) {
    const auto byte = static_cast<uint8_t>(content[i]);
    auto& children = trie->nodes[node].children;
    auto it = std::find_if(children.begin(), children.end(),
                           [byte](const auto& c) { return c.first == byte; });
    if (it != children.end()) {
      node = it->second;
      continue;
    }
    const auto child = static_cast<int32_t>(trie->nodes.size());
    trie->nodes[node].children.emplace_back(byte, child);
    trie->nodes.emplace_back();
    node = child;
  }
  // The first of two tokens with the same content wins.
  if (trie->nodes[node].token < 0) trie->nodes[node].token = token;
}

std::pair<int32_t, size_t> AddedVocab::LongestAt(const Trie& trie, std::string_view text,
                                                 size_t pos) const {
  int32_t node = trie.root[static_cast<uint8_t>(text[pos])];
  std::pair<int32_t, size_t> best(-1, 0);
  for (size_t i = pos + 1; node >= 0; ++i) {
    if (trie.nodes[node].token >= 0) best = {trie.nodes[node].token, i - pos};
    if (i == text.size()) break;
    const auto byte = static_cast<uint8_t>(text[i]);
    const auto& children = trie.nodes[node].children;
    auto it = std::find_if(children.begin(), children.end(),
                           [byte](const auto& c) { return c.first == byte; });
    node = it == children.end() ? -1 : it->second;
  }
  return best;
}

bool AddedVocab::IsWordChar(std::string_view text, size_t pos) const {
  const Utf8Char ch = DecodeUtf8(text, pos);
  if (ch.status != Utf8Status::kValid) return false;
  std::vector<Regex::Match> matches;
  word_char_->FindAll(text.substr(pos, ch.length), &matches);
  return !matches.empty();
}

bool AddedVocab::EndsWithWordChar(std::string_view text) const {
  return !text.empty() && IsWordChar(text, PreviousCharStart(text, text.size()));
}

void AddedVocab::Split(std::string_view text, bool normalized_pass, bool parse_special,
                       std::vector<Segment>* out) const {
  out->clear();
  const Trie& trie = tries_[normalized_pass];
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto [index, length] = LongestAt(trie, text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + length;
    // Matching resumes after the token itself, even when rstrip takes more below (as in HF).
    pos = stop;
    const AddedToken& token = tokens_[static_cast<size_t>(index)];
    if (token.special && !parse_special) continue;
    if (token.single_word && (EndsWithWordChar(text.substr(0, start)) ||
                              (stop < text.size() && IsWordChar(text, stop)))) {
      continue;
    }
    if (token.lstrip) {
      size_t s = start;
      while (s > 0) {
        const size_t prev = PreviousCharStart(text, s);
        uint32_t unused;
        if (!WhitespaceAt(text, prev, &unused)) break;
        s = prev;
      }
      start = std::max(s, start_offset);
    }
    if (token.rstrip) {
      uint32_t ws_length;
      while (stop < text.size() && WhitespaceAt(text, stop, &ws_length)) stop += ws_length;
    }
    if (start > start_offset) out->push_back({start_offset, start, -1});
    out->push_back({start, stop, token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({start_offset, text.size(), -1});
}

const AddedToken* AddedVocab::FindByContent(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocab::FindById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

}  // namespace dinfer::tokenizer
