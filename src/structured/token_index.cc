#include "structured/token_index.h"

#include <algorithm>
#include <numeric>

namespace dinfer::structured {

std::shared_ptr<const TokenIndex> TokenIndex::FromTokenizer(const tokenizer::Tokenizer& tokenizer,
                                                            std::vector<int32_t> stop_ids) {
  std::vector<std::string> tokens(tokenizer.vocab_size());
  std::vector<int32_t> special;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    tokens[id] = tokenizer.TokenBytes(id);
    if (tokenizer.IsSpecial(id)) special.push_back(id);
  }
  if (stop_ids.empty()) stop_ids = tokenizer.eos_ids();
  return FromTokens(std::move(tokens), std::move(stop_ids), special);
}

std::shared_ptr<const TokenIndex> TokenIndex::FromTokens(std::vector<std::string> tokens,
                                                         std::vector<int32_t> stop_ids,
                                                         const std::vector<int32_t>& excluded) {
  auto index = std::shared_ptr<TokenIndex>(new TokenIndex());
  index->bytes_ = std::move(tokens);
  std::sort(stop_ids.begin(), stop_ids.end());
  stop_ids.erase(std::unique(stop_ids.begin(), stop_ids.end()), stop_ids.end());
  std::erase_if(stop_ids, [&](int32_t id) { return id < 0 || id >= index->vocab_size(); });
  index->stop_ids_ = std::move(stop_ids);
  std::vector<uint8_t> skip(index->bytes_.size(), 0);
  for (int32_t id : excluded) {
    if (id >= 0 && id < index->vocab_size()) skip[id] = 1;
  }
  for (int32_t id : index->stop_ids_) skip[id] = 1;
  index->Build(skip);
  return index;
}

bool TokenIndex::IsStop(int32_t id) const {
  return std::binary_search(stop_ids_.begin(), stop_ids_.end(), id);
}

void TokenIndex::Build(const std::vector<uint8_t>& excluded) {
  std::vector<int32_t> ids;
  matchable_.assign(bytes_.size(), 0);
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (!excluded[id] && !bytes_[id].empty()) {
      ids.push_back(id);
      matchable_[id] = 1;
    }
  }
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  sorted_ = ids;
  nodes_.clear();
  nodes_.push_back(Node{});
  // Open nodes along the current path: path[d] is the node at depth d.
  std::vector<int32_t> path = {0};
  const std::string* prev = nullptr;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string& t = bytes_[ids[i]];
    max_token_bytes_ = std::max(max_token_bytes_, static_cast<int32_t>(t.size()));
    size_t lcp = 0;
    if (prev) {
      while (lcp < prev->size() && lcp < t.size() && (*prev)[lcp] == t[lcp]) ++lcp;
    }
    while (path.size() > lcp + 1) {
      const int32_t n = path.back();
      path.pop_back();
      nodes_[n].subtree_end = static_cast<int32_t>(nodes_.size());
      nodes_[n].sub_tok_end = static_cast<int32_t>(i);
    }
    for (size_t d = lcp; d < t.size(); ++d) {
      Node node;
      node.byte = static_cast<uint8_t>(t[d]);
      node.depth = static_cast<uint16_t>(d + 1);
      node.tok_begin = node.tok_end = static_cast<int32_t>(i);
      nodes_.push_back(node);
      path.push_back(static_cast<int32_t>(nodes_.size() - 1));
    }
    Node& last = nodes_[path.back()];
    if (last.tok_end == static_cast<int32_t>(i) || last.tok_begin == last.tok_end) {
      if (last.tok_begin == last.tok_end) last.tok_begin = static_cast<int32_t>(i);
      last.tok_end = static_cast<int32_t>(i) + 1;
    }
    prev = &t;
  }
  while (!path.empty()) {
    const int32_t n = path.back();
    path.pop_back();
    nodes_[n].subtree_end = static_cast<int32_t>(nodes_.size());
    nodes_[n].sub_tok_end = static_cast<int32_t>(ids.size());
  }
  nodes_[0].tok_begin = nodes_[0].tok_end = 0;
  single_byte_.fill(-1);
  for (int32_t id : ids) {
    if (bytes_[id].size() == 1 && single_byte_[static_cast<uint8_t>(bytes_[id][0])] < 0) {
      single_byte_[static_cast<uint8_t>(bytes_[id][0])] = id;
    }
  }
  root_children_.clear();
  for (int32_t i = 1; i < static_cast<int32_t>(nodes_.size()); i = nodes_[i].subtree_end) {
    root_children_.push_back(i);
  }
}

}  // namespace dinfer::structured
