#include "structured/masks.h"

#include <algorithm>
#include <string_view>

#include "structured/pda.h"

namespace dinfer::structured {

void TokenSet::OrInto(uint32_t* mask) const {
  if (!bits.empty()) {
    const size_t n = bits.size();
    const uint32_t* src = bits.data();
    for (size_t i = 0; i < n; ++i) mask[i] |= src[i];
    return;
  }
  for (int32_t id : ids) SetBit(mask, id);
}

size_t StateMasks::MemoryBytes() const {
  return inside.MemoryBytes() + counted.size() * sizeof(Counted) + pop_end.size() * 8 +
         finite_lo.size() * 8 + suffixes.nodes.size() * sizeof(SuffixTrie::Node) +
         suffixes.tokens.size() * 8;
}

namespace {

struct PopEntry {
  int32_t token;
  uint32_t offset;  // bytes of the token consumed when the rule finished
  uint32_t count;
};

TokenSet MakeTokenSet(std::vector<int32_t> ids, int32_t vocab_size) {
  TokenSet set;
  set.count = static_cast<int32_t>(ids.size());
  if (static_cast<int64_t>(ids.size()) * 32 > vocab_size) {
    set.bits.assign(BitmaskWords(vocab_size), 0);
    for (int32_t id : ids) SetBit(set.bits.data(), id);
  } else {
    std::sort(ids.begin(), ids.end());
    set.ids = std::move(ids);
  }
  return set;
}

SuffixTrie BuildSuffixTrie(std::vector<PopEntry> entries, const TokenIndex& index) {
  auto suffix = [&](const PopEntry& e) {
    return std::string_view(index.bytes(e.token)).substr(e.offset);
  };
  std::sort(entries.begin(), entries.end(), [&](const PopEntry& a, const PopEntry& b) {
    const auto sa = suffix(a), sb = suffix(b);
    if (sa != sb) return sa < sb;
    return a.token != b.token ? a.token < b.token : a.count < b.count;
  });
  SuffixTrie trie;
  trie.nodes.push_back(SuffixTrie::Node{});
  std::vector<int32_t> path = {0};
  std::string_view prev;
  bool first = true;
  for (const PopEntry& e : entries) {
    const std::string_view s = suffix(e);
    if (first || s != prev) {
      size_t lcp = 0;
      while (lcp < prev.size() && lcp < s.size() && prev[lcp] == s[lcp]) ++lcp;
      while (path.size() > lcp + 1) {
        trie.nodes[path.back()].subtree_end = static_cast<int32_t>(trie.nodes.size());
        path.pop_back();
      }
      for (size_t d = lcp; d < s.size(); ++d) {
        SuffixTrie::Node node;
        node.byte = static_cast<uint8_t>(s[d]);
        node.depth = static_cast<uint16_t>(d + 1);
        node.entry_begin = node.entry_end = static_cast<int32_t>(trie.tokens.size());
        trie.nodes.push_back(node);
        path.push_back(static_cast<int32_t>(trie.nodes.size() - 1));
      }
      first = false;
      prev = s;
    }
    trie.tokens.push_back(e.token);
    trie.counts.push_back(e.count);
    trie.nodes[path.back()].entry_end = static_cast<int32_t>(trie.tokens.size());
  }
  while (!path.empty()) {
    trie.nodes[path.back()].subtree_end = static_cast<int32_t>(trie.nodes.size());
    path.pop_back();
  }
  return trie;
}

}  // namespace

StateMasks ComputeStateMasks(const Automaton& automaton, int32_t state, const TokenIndex& index) {
  const auto& nodes = index.nodes();
  const auto& sorted = index.sorted();
  const bool counted = automaton.rule(automaton.state(state).rule).counted;
  Pda pda(automaton);
  FramePool pool;
  std::vector<Config> cfg(static_cast<size_t>(index.max_token_bytes()) + 1);
  cfg[0].tops.push_back(Top{state, 0, kBottom});
  std::vector<int32_t> inside;
  std::vector<StateMasks::Counted> inside_counted;
  std::vector<std::pair<int32_t, uint32_t>> pop_end;
  std::vector<PopEntry> entries;
  const int32_t n = static_cast<int32_t>(nodes.size());
  for (int32_t i = 1; i < n;) {
    const TokenIndex::Node& node = nodes[i];
    const int d = node.depth;
    pda.Step(cfg[d - 1], node.byte, &pool, &cfg[d]);
    for (uint32_t j : cfg[d].pops) {
      for (int32_t t = node.tok_begin; t < node.tok_end; ++t) pop_end.emplace_back(sorted[t], j);
      for (int32_t t = node.tok_end; t < node.sub_tok_end; ++t) {
        entries.push_back({sorted[t], static_cast<uint32_t>(d), j});
      }
    }
    if (cfg[d].tops.empty()) {
      i = node.subtree_end;
      continue;
    }
    for (int32_t t = node.tok_begin; t < node.tok_end; ++t) {
      inside.push_back(sorted[t]);
      if (counted) {
        const Top& top = cfg[d].tops[0];
        const Automaton::State& end = automaton.state(top.state);
        const uint64_t hi = static_cast<uint64_t>(top.count) + end.need_min;
        const uint64_t lo = end.need_max == kInfiniteCount
                                ? kInfiniteCount
                                : static_cast<uint64_t>(top.count) + end.need_max;
        inside_counted.push_back({sorted[t],
                                  static_cast<uint32_t>(std::min<uint64_t>(hi, kInfiniteCount)),
                                  static_cast<uint32_t>(std::min<uint64_t>(lo, kInfiniteCount))});
      }
    }
    ++i;
  }
  StateMasks m;
  if (!counted) {
    // A token accepted inside needs no pop check.
    std::vector<uint8_t> in(index.vocab_size(), 0);
    for (int32_t t : inside) in[t] = 1;
    std::erase_if(pop_end, [&](const auto& p) { return in[p.first] != 0; });
    std::erase_if(entries, [&](const PopEntry& e) { return in[e.token] != 0; });
  }
  std::sort(inside_counted.begin(), inside_counted.end(), [](const auto& a, const auto& b) {
    return a.hi != b.hi ? a.hi < b.hi : a.token < b.token;
  });
  for (const auto& c : inside_counted) {
    if (c.lo != kInfiniteCount) m.finite_lo.emplace_back(c.lo, c.token);
  }
  std::sort(m.finite_lo.begin(), m.finite_lo.end());
  m.counted = std::move(inside_counted);
  m.inside = MakeTokenSet(std::move(inside), index.vocab_size());
  std::sort(pop_end.begin(), pop_end.end());
  pop_end.erase(std::unique(pop_end.begin(), pop_end.end()), pop_end.end());
  m.pop_end = std::move(pop_end);
  m.suffixes = BuildSuffixTrie(std::move(entries), index);
  return m;
}

}  // namespace dinfer::structured
