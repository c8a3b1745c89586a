#include "structured/matcher.h"

#include <algorithm>
#include <bit>

namespace dinfer::structured {

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), a_(grammar_->automaton()), pda_(a_) {
  walk_.resize(static_cast<size_t>(grammar_->tokens().max_token_bytes()) + 1);
  scratch_.resize(BitmaskWords(vocab_size()));
  Reset();
}

void Matcher::Reset() {
  pool_.Undo(0);
  history_.clear();
  history_.emplace_back();
  pda_.Start(&pool_, &history_.back().cfg);
  history_.back().pool_mark = pool_.size();
}

bool Matcher::StepBytes(const Config& from, std::string_view bytes, Config* out) {
  tmp_ = from;
  for (char c : bytes) {
    pda_.Step(tmp_, static_cast<uint8_t>(c), &pool_, &tmp2_);
    if (tmp2_.Dead()) return false;
    std::swap(tmp_, tmp2_);
  }
  *out = tmp_;
  return true;
}

bool Matcher::AcceptBytes(std::string_view bytes) {
  const Entry& cur = history_.back();
  if (cur.terminated) return false;
  const size_t mark = pool_.size();
  Entry next;
  if (!StepBytes(cur.cfg, bytes, &next.cfg)) {
    pool_.Undo(mark);
    return false;
  }
  next.pool_mark = pool_.size();
  history_.push_back(std::move(next));
  return true;
}

bool Matcher::AcceptToken(int32_t token) {
  const TokenIndex& tokens = grammar_->tokens();
  if (token < 0 || token >= tokens.vocab_size()) return false;
  const Entry& cur = history_.back();
  if (cur.terminated) return false;
  if (tokens.IsStop(token)) {
    if (!cur.cfg.complete) return false;
    Entry next;
    next.cfg.complete = true;
    next.pool_mark = pool_.size();
    next.terminated = true;
    history_.push_back(std::move(next));
    return true;
  }
  if (!tokens.matchable(token)) return false;
  return AcceptBytes(tokens.bytes(token));
}

bool Matcher::Rollback(int32_t steps) {
  if (steps < 0 || steps >= static_cast<int32_t>(history_.size())) return false;
  history_.resize(history_.size() - static_cast<size_t>(steps));
  pool_.Undo(history_.back().pool_mark);
  return true;
}

void Matcher::AddInside(const StateMasks& m, const Automaton::RuleInfo& rule, uint32_t count,
                        uint32_t* mask) {
  if (!rule.counted || (rule.max_count == kUnbounded && rule.min_count <= count)) {
    m.inside.OrInto(mask);
    return;
  }
  const uint64_t room = rule.max_count == kUnbounded ? UINT64_MAX : rule.max_count - count;
  const uint32_t need = rule.min_count > count ? rule.min_count - count : 0;
  const auto& c = m.counted;
  const size_t cut = static_cast<size_t>(
      std::partition_point(c.begin(), c.end(), [&](const auto& e) { return e.hi <= room; }) -
      c.begin());
  if (cut == c.size() && (m.finite_lo.empty() || m.finite_lo.front().first >= need)) {
    m.inside.OrInto(mask);
    return;
  }
  if (m.inside.bits.empty() || cut < c.size() / 2) {
    for (size_t i = 0; i < cut; ++i) {
      if (c[i].lo == kInfiniteCount || c[i].lo >= need) SetBit(mask, c[i].token);
    }
    return;
  }
  const size_t words = scratch_.size();
  std::copy(m.inside.bits.begin(), m.inside.bits.end(), scratch_.begin());
  for (size_t i = cut; i < c.size(); ++i) {
    scratch_[c[i].token >> 5] &= ~(1u << (c[i].token & 31));
  }
  for (const auto& [lo, token] : m.finite_lo) {
    if (lo >= need) break;
    scratch_[token >> 5] &= ~(1u << (token & 31));
  }
  for (size_t i = 0; i < words; ++i) mask[i] |= scratch_[i];
}

void Matcher::WalkSuffixes(const SuffixTrie& trie, const Config& start,
                           const Automaton::RuleInfo& rule, uint32_t count, uint32_t* mask) {
  ByteSet256 first{};
  for (const Top& t : start.tops) {
    const ByteSet256& f = grammar_->first_bytes(t.state);
    for (int i = 0; i < 4; ++i) first[i] |= f[i];
  }
  walk_[0] = start;
  const auto& nodes = trie.nodes;
  const int32_t n = static_cast<int32_t>(nodes.size());
  for (int32_t i = 1; i < n;) {
    const SuffixTrie::Node& node = nodes[i];
    if (node.depth == 1 && !ByteIn(first, node.byte)) {
      i = node.subtree_end;
      continue;
    }
    Config& cfg = walk_[node.depth];
    pda_.Step(walk_[node.depth - 1], node.byte, &pool_, &cfg);
    if (cfg.Dead()) {
      i = node.subtree_end;
      continue;
    }
    for (int32_t e = node.entry_begin; e < node.entry_end; ++e) {
      if (CountOk(rule, static_cast<uint64_t>(count) + trie.counts[e]))
        SetBit(mask, trie.tokens[e]);
    }
    ++i;
  }
}

void Matcher::FillNextTokenBitmask(uint32_t* bitmask) {
  const TokenIndex& tokens = grammar_->tokens();
  std::fill(bitmask, bitmask + BitmaskWords(tokens.vocab_size()), 0u);
  const Entry& cur = history_.back();
  if (cur.terminated) return;
  const size_t mark = pool_.size();
  int32_t continued_parent = kBottom;
  for (const Top& top : cur.cfg.tops) {
    const StateMasks& m = grammar_->masks(top.state);
    const Automaton::RuleInfo& rule = a_.rule(a_.state(top.state).rule);
    AddInside(m, rule, top.count, bitmask);
    for (const auto& [token, j] : m.pop_end) {
      if (CountOk(rule, static_cast<uint64_t>(top.count) + j)) SetBit(bitmask, token);
    }
    if (m.suffixes.empty() || top.parent == kRoot) continue;
    // The stack below the finished rule; tops of one rule often share it.
    if (top.parent != continued_parent) {
      pda_.Continue(top.parent, &pool_, &tmp_);
      continued_parent = top.parent;
    }
    if (!tmp_.tops.empty()) WalkSuffixes(m.suffixes, tmp_, rule, top.count, bitmask);
  }
  if (cur.cfg.complete) {
    for (int32_t id : tokens.stop_ids()) SetBit(bitmask, id);
  }
  pool_.Undo(mark);
}

uint64_t Matcher::Distance(const Config& cfg) const {
  if (cfg.complete) return 0;
  uint64_t best = kInfiniteCount;
  for (const Top& t : cfg.tops) {
    const Automaton::State& st = a_.state(t.state);
    uint64_t d = st.to_end;
    const Automaton::RuleInfo& rule = a_.rule(st.rule);
    // Characters still owed to a lower bound beyond the state's own need, a byte each at least.
    if (rule.counted && rule.min_count > static_cast<uint64_t>(t.count) + st.need_min) {
      d += rule.min_count - t.count - st.need_min;
    }
    for (int32_t f = t.parent; f >= 0; f = pool_[f].parent) d += a_.state(pool_[f].state).to_end;
    best = std::min(best, d);
  }
  return best;
}

void Matcher::FillNextTokenBitmask(uint32_t* bitmask, int64_t remaining_tokens) {
  FillNextTokenBitmask(bitmask);
  const Entry& cur = history_.back();
  if (cur.terminated) return;
  const uint64_t distance = Distance(cur.cfg);
  // This token, the completion one byte a token, and a stop token must fit.
  if (remaining_tokens < 0 ||
      static_cast<uint64_t>(remaining_tokens) > distance + 2 + kFinishWindow) {
    return;
  }
  const TokenIndex& tokens = grammar_->tokens();
  std::fill(scratch_.begin(), scratch_.end(), 0u);
  bool any = false;
  const size_t mark = pool_.size();
  Config next;
  for (int b = 0; b < 256; ++b) {
    const int32_t id = tokens.single_byte_token(static_cast<uint8_t>(b));
    if (id < 0 || !TestBit(bitmask, id)) continue;
    pda_.Step(cur.cfg, static_cast<uint8_t>(b), &pool_, &next);
    // After this token, the completion one byte a token and a stop token still fit.
    if (next.Dead() || Distance(next) + 2 > static_cast<uint64_t>(remaining_tokens)) continue;
    SetBit(scratch_.data(), id);
    any = true;
  }
  pool_.Undo(mark);
  if (cur.cfg.complete) {
    for (int32_t id : tokens.stop_ids()) SetBit(scratch_.data(), id);
    any = true;
  }
  if (any) std::copy(scratch_.begin(), scratch_.end(), bitmask);
}

std::string Matcher::FindJumpForwardString(size_t max_bytes) {
  std::string out;
  const Entry& cur = history_.back();
  if (cur.terminated) return out;
  const size_t mark = pool_.size();
  Config cfg = cur.cfg, next;
  while (out.size() < max_bytes && !cfg.complete && !cfg.tops.empty()) {
    ByteSet256 allowed{};
    for (const Top& t : cfg.tops) {
      const ByteSet256& f = grammar_->first_bytes(t.state);
      for (int i = 0; i < 4; ++i) allowed[i] |= f[i];
    }
    int total = 0;
    for (uint64_t w : allowed) total += std::popcount(w);
    if (total != 1) break;
    int byte = 0;
    for (int i = 0; i < 4; ++i) {
      if (allowed[i]) byte = i * 64 + std::countr_zero(allowed[i]);
    }
    pda_.Step(cfg, static_cast<uint8_t>(byte), &pool_, &next);
    if (next.Dead()) break;
    out.push_back(static_cast<char>(byte));
    std::swap(cfg, next);
  }
  pool_.Undo(mark);
  return out;
}

}  // namespace dinfer::structured
