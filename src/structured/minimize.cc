#include <algorithm>
#include <tuple>

#include "structured/rule_dfa.h"

namespace dinfer::structured {
namespace {

// A partition of 0..n-1 into sets that can be refined by marking elements (Valmari's
// refinable partition).
class RefinablePartition {
 public:
  explicit RefinablePartition(int32_t n)
      : elems_(n),
        loc_(n),
        set_(n, 0),
        first_(n + 1),
        past_(n + 1),
        marked_(n + 1, 0),
        touched_(n + 1) {
    for (int32_t i = 0; i < n; ++i) elems_[i] = loc_[i] = i;
    sets_ = n > 0 ? 1 : 0;
    first_[0] = 0;
    past_[0] = n;
  }
  int32_t sets() const { return sets_; }
  int32_t set_of(int32_t e) const { return set_[e]; }
  int32_t first(int32_t s) const { return first_[s]; }
  int32_t past(int32_t s) const { return past_[s]; }
  int32_t elem(int32_t i) const { return elems_[i]; }
  // Sets [first, past) of elements already ordered, for an initial grouping.
  void Assign(const std::vector<int32_t>& order, const std::vector<int32_t>& starts) {
    sets_ = static_cast<int32_t>(starts.size()) - 1;
    for (int32_t k = 0; k < sets_; ++k) {
      first_[k] = starts[k];
      past_[k] = starts[k + 1];
      for (int32_t i = starts[k]; i < starts[k + 1]; ++i) {
        elems_[i] = order[i];
        loc_[order[i]] = i;
        set_[order[i]] = k;
      }
    }
  }
  void Mark(int32_t e) {
    const int32_t s = set_[e];
    const int32_t i = loc_[e];
    const int32_t j = first_[s] + marked_[s];
    elems_[i] = elems_[j];
    loc_[elems_[i]] = i;
    elems_[j] = e;
    loc_[e] = j;
    if (!marked_[s]++) touched_[num_touched_++] = s;
  }
  void Split() {
    while (num_touched_) {
      const int32_t s = touched_[--num_touched_];
      const int32_t j = first_[s] + marked_[s];
      if (j == past_[s]) {
        marked_[s] = 0;
        continue;
      }
      // The smaller part becomes the new set.
      if (marked_[s] <= past_[s] - j) {
        first_[sets_] = first_[s];
        past_[sets_] = first_[s] = j;
      } else {
        past_[sets_] = past_[s];
        first_[sets_] = past_[s] = j;
      }
      for (int32_t i = first_[sets_]; i < past_[sets_]; ++i) set_[elems_[i]] = sets_;
      marked_[s] = marked_[sets_++] = 0;
    }
  }

 private:
  std::vector<int32_t> elems_, loc_, set_, first_, past_, marked_, touched_;
  int32_t sets_ = 0, num_touched_ = 0;
};

}  // namespace

// Minimization by Valmari's algorithm (partition refinement over states and transitions, for
// partial automata). Byte transitions are labelled by class and mark, calls by callee.
Dfa Minimize(const Dfa& dfa, std::array<uint8_t, 256>* classes, int* num_classes, bool refine) {
  std::array<uint8_t, 257> cut{};
  cut[0] = 1;
  for (const DState& s : dfa.states) {
    for (const Segment& seg : s.segs) {
      cut[seg.lo] = 1;
      cut[seg.hi + 1] = 1;
    }
  }
  int nc = -1;
  for (int b = 0; b < 256; ++b) {
    if (cut[b]) ++nc;
    (*classes)[b] = static_cast<uint8_t>(nc);
  }
  *num_classes = nc + 1;
  if (!refine) return dfa;
  const int32_t n = static_cast<int32_t>(dfa.states.size());
  // Transitions (tail, label, head).
  std::vector<int32_t> tail, label, head;
  std::vector<int32_t> callees;
  for (int32_t s = 0; s < n; ++s) {
    for (const Segment& seg : dfa.states[s].segs) {
      for (int c = (*classes)[seg.lo]; c <= (*classes)[seg.hi]; ++c) {
        tail.push_back(s);
        label.push_back(c * 4 + seg.mark);
        head.push_back(seg.to);
      }
    }
    for (const auto& [rule, to] : dfa.states[s].calls) {
      auto it = std::find(callees.begin(), callees.end(), rule);
      if (it == callees.end()) it = callees.insert(callees.end(), rule);
      tail.push_back(s);
      label.push_back(1024 + static_cast<int32_t>(it - callees.begin()));
      head.push_back(to);
    }
  }
  const int32_t m = static_cast<int32_t>(tail.size());
  // Initial blocks: finality and the counts still needed.
  RefinablePartition blocks(n);
  {
    std::vector<int32_t> order(n);
    for (int32_t i = 0; i < n; ++i) order[i] = i;
    auto key = [&](int32_t s) {
      const DState& st = dfa.states[s];
      return std::make_tuple(st.final, st.need_min, st.need_max);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t x, int32_t y) { return key(x) < key(y); });
    std::vector<int32_t> starts = {0};
    for (int32_t i = 1; i < n; ++i) {
      if (key(order[i]) != key(order[i - 1])) starts.push_back(i);
    }
    starts.push_back(n);
    blocks.Assign(order, starts);
  }
  // Cords: transitions grouped by label.
  RefinablePartition cords(m);
  {
    std::vector<int32_t> order(m);
    for (int32_t i = 0; i < m; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t x, int32_t y) { return label[x] < label[y]; });
    std::vector<int32_t> starts = {0};
    for (int32_t i = 1; i < m; ++i) {
      if (label[order[i]] != label[order[i - 1]]) starts.push_back(i);
    }
    starts.push_back(m);
    if (m > 0) cords.Assign(order, starts);
  }
  // Incoming transitions of each state.
  std::vector<int32_t> in_first(n + 1, 0), in_list(m);
  for (int32_t t = 0; t < m; ++t) ++in_first[head[t] + 1];
  for (int32_t s = 0; s < n; ++s) in_first[s + 1] += in_first[s];
  {
    std::vector<int32_t> fill(in_first.begin(), in_first.end() - 1);
    for (int32_t t = 0; t < m; ++t) in_list[fill[head[t]]++] = t;
  }
  int32_t b = 1, c = 0;
  while (c < cords.sets()) {
    for (int32_t i = cords.first(c); i < cords.past(c); ++i) blocks.Mark(tail[cords.elem(i)]);
    blocks.Split();
    ++c;
    while (b < blocks.sets()) {
      for (int32_t i = blocks.first(b); i < blocks.past(b); ++i) {
        const int32_t s = blocks.elem(i);
        for (int32_t j = in_first[s]; j < in_first[s + 1]; ++j) cords.Mark(in_list[j]);
      }
      cords.Split();
      ++b;
    }
  }
  const int32_t num_blocks = blocks.sets();
  Dfa out;
  out.states.resize(num_blocks);
  std::vector<uint8_t> done(num_blocks, 0);
  for (int32_t s = 0; s < n; ++s) {
    const int32_t blk = blocks.set_of(s);
    if (done[blk]) continue;
    done[blk] = 1;
    DState st = dfa.states[s];
    for (Segment& seg : st.segs) seg.to = blocks.set_of(seg.to);
    for (auto& call : st.calls) call.second = blocks.set_of(call.second);
    out.states[blk] = std::move(st);
  }
  out.start = blocks.set_of(dfa.start);
  return out;
}

}  // namespace dinfer::structured
