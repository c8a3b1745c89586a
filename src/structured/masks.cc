#include "structured/masks.h"

#include <algorithm>
#include <array>
#include <bit>
#include <string_view>
#include <unordered_map>

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

// Builds a suffix trie from entries in any order: children are found by hashing (node, byte),
// then numbered in preorder with children by byte.
class SuffixTrieBuilder {
 public:
  explicit SuffixTrieBuilder(const TokenIndex& index) : index_(index) { parent_.push_back(-1); }

  void Add(const PopEntry& e) {
    const std::string& bytes = index_.bytes(e.token);
    int32_t node = 0;
    for (size_t i = e.offset; i < bytes.size(); ++i) {
      const uint8_t b = static_cast<uint8_t>(bytes[i]);
      const uint64_t key = static_cast<uint64_t>(node) << 8 | b;
      auto [it, inserted] = child_.try_emplace(key, static_cast<int32_t>(parent_.size()));
      if (inserted) {
        parent_.push_back(node);
        byte_.push_back(b);
      }
      node = it->second;
    }
    entries_.push_back({node, e.token, e.count});
  }

  SuffixTrie Build() {
    const int32_t n = static_cast<int32_t>(parent_.size());
    // Children of each node, ordered by byte.
    std::vector<std::pair<uint64_t, int32_t>> edges;
    edges.reserve(child_.size());
    for (const auto& [key, child] : child_) edges.emplace_back(key, child);
    std::sort(edges.begin(), edges.end());
    std::vector<int32_t> first(n + 1, 0), kids(edges.size());
    for (const auto& e : edges) ++first[(e.first >> 8) + 1];
    for (int32_t i = 0; i < n; ++i) first[i + 1] += first[i];
    for (size_t i = 0; i < edges.size(); ++i) kids[i] = edges[i].second;
    // Preorder numbering.
    std::vector<int32_t> pre(n, 0), stack = {0};
    std::vector<int32_t> order;
    order.reserve(n);
    while (!stack.empty()) {
      const int32_t x = stack.back();
      stack.pop_back();
      pre[x] = static_cast<int32_t>(order.size());
      order.push_back(x);
      for (int32_t k = first[x + 1]; k-- > first[x];) stack.push_back(kids[k]);
    }
    SuffixTrie trie;
    trie.nodes.resize(n);
    std::vector<int32_t> count(n + 1, 0);
    for (const auto& e : entries_) ++count[pre[e.node] + 1];
    for (int32_t i = 0; i < n; ++i) count[i + 1] += count[i];
    trie.tokens.resize(entries_.size());
    trie.counts.resize(entries_.size());
    std::vector<int32_t> fill(count.begin(), count.end() - 1);
    for (const auto& e : entries_) {
      const int32_t slot = fill[pre[e.node]]++;
      trie.tokens[slot] = e.token;
      trie.counts[slot] = e.count;
    }
    // Depths and subtree ends (a node's subtree ends where the next node at its depth or above
    // begins).
    std::vector<int32_t> depth(n, 0);
    for (int32_t i = 1; i < n; ++i) depth[order[i]] = depth[parent_[order[i]]] + 1;
    std::vector<int32_t> open;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t x = order[i];
      SuffixTrie::Node& node = trie.nodes[i];
      node.byte = i == 0 ? 0 : byte_[x - 1];
      node.depth = static_cast<uint16_t>(depth[x]);
      node.entry_begin = count[i];
      node.entry_end = count[i + 1];
      while (!open.empty() && trie.nodes[open.back()].depth >= node.depth) {
        trie.nodes[open.back()].subtree_end = i;
        open.pop_back();
      }
      open.push_back(i);
    }
    for (int32_t i : open) trie.nodes[i].subtree_end = n;
    return trie;
  }

 private:
  struct Entry {
    int32_t node;
    int32_t token;
    uint32_t count;
  };
  const TokenIndex& index_;
  std::unordered_map<uint64_t, int32_t> child_;
  std::vector<int32_t> parent_;
  std::vector<uint8_t> byte_;  // of node i + 1
  std::vector<Entry> entries_;
};

// The entries of a trie.
std::vector<PopEntry> TrieEntries(const SuffixTrie& trie, const TokenIndex& index) {
  std::vector<PopEntry> out;
  for (const SuffixTrie::Node& node : trie.nodes) {
    for (int32_t e = node.entry_begin; e < node.entry_end; ++e) {
      const auto len = static_cast<uint32_t>(index.bytes(trie.tokens[e]).size());
      out.push_back({trie.tokens[e], len - node.depth, trie.counts[e]});
    }
  }
  return out;
}

// Counted tokens by hi (then id): a counting sort, hi being small.
void SortByHi(std::vector<StateMasks::Counted>* v) {
  uint32_t top = 0;
  for (const auto& c : *v) top = std::max(top, c.hi);
  if (top > 1 << 16) {
    std::sort(v->begin(), v->end(), [](const auto& a, const auto& b) {
      return a.hi != b.hi ? a.hi < b.hi : a.token < b.token;
    });
    return;
  }
  std::vector<int32_t> start(top + 2, 0);
  for (const auto& c : *v) ++start[c.hi + 1];
  for (uint32_t i = 0; i <= top; ++i) start[i + 1] += start[i];
  std::vector<StateMasks::Counted> out(v->size());
  for (const auto& c : *v) out[start[c.hi]++] = c;
  *v = std::move(out);
}

// What a walk of (part of) the vocabulary trie found.
struct RawMasks {
  std::vector<int32_t> inside;
  std::vector<StateMasks::Counted> counted;
  std::vector<std::pair<int32_t, uint32_t>> pop_end;
  std::vector<PopEntry> entries;
};

void AddInside(const Automaton& automaton, bool counted, int32_t token, int32_t end_state,
               uint32_t count, RawMasks* raw) {
  raw->inside.push_back(token);
  if (!counted) return;
  const Automaton::State& end = automaton.state(end_state);
  const uint64_t hi = static_cast<uint64_t>(count) + end.need_min;
  const uint64_t lo =
      end.need_max == kInfiniteCount ? kInfiniteCount : static_cast<uint64_t>(count) + end.need_max;
  raw->counted.push_back({token, static_cast<uint32_t>(std::min<uint64_t>(hi, kInfiniteCount)),
                          static_cast<uint32_t>(std::min<uint64_t>(lo, kInfiniteCount))});
}

void AddPops(const TokenIndex::Node& node, const std::vector<int32_t>& sorted, uint32_t count,
             RawMasks* raw) {
  for (int32_t t = node.tok_begin; t < node.tok_end; ++t)
    raw->pop_end.emplace_back(sorted[t], count);
  for (int32_t t = node.tok_end; t < node.sub_tok_end; ++t) {
    raw->entries.push_back({sorted[t], static_cast<uint32_t>(node.depth), count});
  }
}

// A rule that calls nothing runs as a plain automaton: one state and count per trie depth.
void WalkLeaf(const Automaton& automaton, int32_t state, const TokenIndex& index,
              const std::array<uint8_t, 256>* only, bool counted, RawMasks* raw) {
  const auto& nodes = index.nodes();
  const auto& sorted = index.sorted();
  std::vector<int32_t> st(static_cast<size_t>(index.max_token_bytes()) + 1);
  std::vector<uint32_t> cnt(st.size());
  st[0] = state;
  cnt[0] = 0;
  const int32_t n = static_cast<int32_t>(nodes.size());
  for (int32_t i = 1; i < n;) {
    const TokenIndex::Node& node = nodes[i];
    const int d = node.depth;
    if (d == 1 && only && !(*only)[node.byte]) {
      i = node.subtree_end;
      continue;
    }
    const int32_t w = automaton.Next(st[d - 1], node.byte);
    if (w < 0) {
      i = node.subtree_end;
      continue;
    }
    const int32_t t = w & kTargetMask;
    const uint32_t k = cnt[d - 1] + ((w & kIncBit) ? 1u : 0u);
    const Automaton::State& ts = automaton.state(t);
    if (ts.final) AddPops(node, sorted, k, raw);
    if (ts.trans_base < 0) {
      i = node.subtree_end;
      continue;
    }
    st[d] = t;
    cnt[d] = k;
    for (int32_t x = node.tok_begin; x < node.tok_end; ++x) {
      AddInside(automaton, counted, sorted[x], t, k, raw);
    }
    ++i;
  }
}

// Walks the trie from `state` with a stack whose bottom is the state's rule; only the subtrees
// of the first bytes in `only` when given.
void Walk(const Automaton& automaton, int32_t state, const TokenIndex& index, bool leaf,
          const std::array<uint8_t, 256>* only, RawMasks* raw) {
  const auto& nodes = index.nodes();
  const auto& sorted = index.sorted();
  const bool counted = automaton.rule(automaton.state(state).rule).counted;
  if (leaf) {
    WalkLeaf(automaton, state, index, only, counted, raw);
  } else {
    Pda pda(automaton);
    FramePool pool;
    std::vector<Config> cfg(static_cast<size_t>(index.max_token_bytes()) + 1);
    cfg[0].tops.push_back(Top{state, 0, kBottom});
    const int32_t n = static_cast<int32_t>(nodes.size());
    for (int32_t i = 1; i < n;) {
      const TokenIndex::Node& node = nodes[i];
      const int d = node.depth;
      // The start is a single stack: its own transitions decide the first byte.
      if (d == 1 && ((only && !(*only)[node.byte]) || automaton.Next(state, node.byte) < 0)) {
        i = node.subtree_end;
        continue;
      }
      pda.Step(cfg[d - 1], node.byte, &pool, &cfg[d]);
      for (uint32_t j : cfg[d].pops) AddPops(node, sorted, j, raw);
      if (cfg[d].tops.empty()) {
        i = node.subtree_end;
        continue;
      }
      const Top& top = cfg[d].tops[0];
      for (int32_t t = node.tok_begin; t < node.tok_end; ++t) {
        AddInside(automaton, counted, sorted[t], top.state, top.count, raw);
      }
      ++i;
    }
  }
  if (!counted && (!raw->pop_end.empty() || !raw->entries.empty())) {
    // A token accepted inside needs no pop check.
    std::vector<uint64_t> in((index.vocab_size() + 63) / 64, 0);
    for (int32_t t : raw->inside) in[t >> 6] |= 1ull << (t & 63);
    auto inside = [&](int32_t t) { return (in[t >> 6] >> (t & 63)) & 1; };
    std::erase_if(raw->pop_end, [&](const auto& p) { return inside(p.first); });
    std::erase_if(raw->entries, [&](const PopEntry& e) { return inside(e.token); });
  }
  SortByHi(&raw->counted);
  std::sort(raw->pop_end.begin(), raw->pop_end.end());
}

void FillCountedExtras(StateMasks* m) {
  m->finite_lo.clear();
  for (const auto& c : m->counted) {
    if (c.lo != kInfiniteCount) m->finite_lo.emplace_back(c.lo, c.token);
  }
  std::sort(m->finite_lo.begin(), m->finite_lo.end());
}

bool IsLeafRule(const Automaton& automaton, int32_t state) {
  const Automaton::RuleInfo& r = automaton.rule(automaton.state(state).rule);
  for (int32_t s = r.first_state; s < r.end_state; ++s) {
    if (automaton.state(s).call_begin != automaton.state(s).call_end) return false;
  }
  return true;
}

}  // namespace

StateMasks ComputeStateMasks(const Automaton& automaton, int32_t state, const TokenIndex& index) {
  RawMasks raw;
  Walk(automaton, state, index, IsLeafRule(automaton, state), nullptr, &raw);
  StateMasks m;
  m.inside = MakeTokenSet(std::move(raw.inside), index.vocab_size());
  m.counted = std::move(raw.counted);
  FillCountedExtras(&m);
  m.pop_end = std::move(raw.pop_end);
  SuffixTrieBuilder builder(index);
  for (const PopEntry& e : raw.entries) builder.Add(e);
  m.suffixes = builder.Build();
  return m;
}

StateMasks DeriveStateMasks(const Automaton& automaton, int32_t state, const TokenIndex& index,
                            int32_t ref_state, const StateMasks& ref) {
  // First bytes on which the two states go different ways: their subtrees are walked afresh;
  // every other subtree continues identically and keeps the reference's results.
  std::array<uint8_t, 256> differ{};
  for (int b = 0; b < 256; ++b) {
    differ[b] = automaton.Next(state, static_cast<uint8_t>(b)) !=
                automaton.Next(ref_state, static_cast<uint8_t>(b));
  }
  RawMasks raw;
  Walk(automaton, state, index, true, &differ, &raw);
  auto kept = [&](int32_t token) { return !differ[static_cast<uint8_t>(index.bytes(token)[0])]; };
  StateMasks m;
  if (!ref.inside.bits.empty()) {
    m.inside.bits = ref.inside.bits;
    for (int32_t child : index.root_children()) {
      const TokenIndex::Node& node = index.nodes()[child];
      if (!differ[node.byte]) continue;
      for (int32_t t = node.tok_begin; t < node.sub_tok_end; ++t) {
        const int32_t id = index.sorted()[t];
        m.inside.bits[id >> 5] &= ~(1u << (id & 31));
      }
    }
    for (int32_t id : raw.inside) SetBit(m.inside.bits.data(), id);
    int32_t count = 0;
    for (uint32_t w : m.inside.bits) count += std::popcount(w);
    m.inside.count = count;
  } else {
    std::vector<int32_t> ids = std::move(raw.inside);
    for (int32_t id : ref.inside.ids) {
      if (kept(id)) ids.push_back(id);
    }
    m.inside = MakeTokenSet(std::move(ids), index.vocab_size());
  }
  auto by_hi = [](const auto& a, const auto& b) {
    return a.hi != b.hi ? a.hi < b.hi : a.token < b.token;
  };
  std::vector<StateMasks::Counted> counted;
  for (const auto& c : ref.counted) {
    if (kept(c.token)) counted.push_back(c);
  }
  m.counted.resize(counted.size() + raw.counted.size());
  std::merge(counted.begin(), counted.end(), raw.counted.begin(), raw.counted.end(),
             m.counted.begin(), by_hi);
  FillCountedExtras(&m);
  m.pop_end = std::move(raw.pop_end);
  for (const auto& p : ref.pop_end) {
    if (kept(p.first)) m.pop_end.push_back(p);
  }
  std::sort(m.pop_end.begin(), m.pop_end.end());
  SuffixTrieBuilder builder(index);
  for (const PopEntry& e : TrieEntries(ref.suffixes, index)) {
    if (kept(e.token)) builder.Add(e);
  }
  for (const PopEntry& e : raw.entries) builder.Add(e);
  m.suffixes = builder.Build();
  return m;
}

}  // namespace dinfer::structured
