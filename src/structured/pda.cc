#include "structured/pda.h"

#include <algorithm>

namespace dinfer::structured {
namespace {

inline uint32_t HashTop(const Top& t) {
  uint64_t h = static_cast<uint32_t>(t.state) * 0x9E3779B97F4A7C15ull;
  h ^= (static_cast<uint64_t>(t.count) + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
  h ^= static_cast<uint32_t>(t.parent) * 0x165667B19E3779F9ull;
  return static_cast<uint32_t>(h ^ (h >> 29));
}

}  // namespace

FramePool::FramePool() : table_(64, -1) {}

int32_t FramePool::Intern(const Top& frame) {
  const uint32_t mask = static_cast<uint32_t>(table_.size() - 1);
  uint32_t slot = HashTop(frame) & mask;
  while (table_[slot] >= 0) {
    if (frames_[table_[slot]] == frame) return table_[slot];
    slot = (slot + 1) & mask;
  }
  const auto id = static_cast<int32_t>(frames_.size());
  frames_.push_back(frame);
  slot_of_.push_back(slot);
  table_[slot] = id;
  if (frames_.size() * 2 > table_.size()) Rehash();
  return id;
}

void FramePool::Rehash() {
  table_.assign(table_.size() * 2, -1);
  const uint32_t mask = static_cast<uint32_t>(table_.size() - 1);
  for (size_t id = 0; id < frames_.size(); ++id) {
    uint32_t slot = HashTop(frames_[id]) & mask;
    while (table_[slot] >= 0) slot = (slot + 1) & mask;
    table_[slot] = static_cast<int32_t>(id);
    slot_of_[id] = slot;
  }
}

void FramePool::Undo(size_t mark) {
  // Linear probing: removing the newest entries first restores the table exactly.
  while (frames_.size() > mark) {
    table_[slot_of_.back()] = -1;
    slot_of_.pop_back();
    frames_.pop_back();
  }
}

bool Pda::Visit(const Top& t) {
  if (std::find(visited_.begin(), visited_.end(), t) != visited_.end()) return false;
  visited_.push_back(t);
  return true;
}

void Pda::ClosureRec(Top t, FramePool* pool, Config* out) {
  const Automaton::State& st = a_.state(t.state);
  // Fast path: a state that only consumes bytes needs no visited-set bookkeeping beyond
  // deduplicating the tops themselves.
  if (!st.final && st.call_begin == st.call_end) {
    if (std::find(out->tops.begin(), out->tops.end(), t) == out->tops.end()) out->tops.push_back(t);
    return;
  }
  if (!Visit(t)) return;
  if (st.trans_base >= 0) out->tops.push_back(t);
  if (st.final) {
    if (t.parent == kRoot) {
      out->complete = true;
    } else if (t.parent == kBottom) {
      if (std::find(out->pops.begin(), out->pops.end(), t.count) == out->pops.end()) {
        out->pops.push_back(t.count);
      }
    } else {
      ClosureRec((*pool)[t.parent], pool, out);
    }
  }
  for (const Automaton::Call* c = a_.calls_begin(t.state); c != a_.calls_end(t.state); ++c) {
    const int32_t frame = pool->Intern(Top{c->ret, t.count, t.parent});
    ClosureRec(Top{a_.rule(c->rule).start, 0, frame}, pool, out);
  }
}

void Pda::Closure(const Top& t, FramePool* pool, Config* out) {
  visited_.clear();
  ClosureRec(t, pool, out);
}

void Pda::Step(const Config& in, uint8_t byte, FramePool* pool, Config* out) {
  out->Clear();
  visited_.clear();
  for (const Top& t : in.tops) {
    const int32_t word = a_.Next(t.state, byte);
    if (word < 0) continue;
    const int32_t target = word & kTargetMask;
    Top next{target, t.count + ((word & kIncBit) ? 1u : 0u), t.parent};
    // The outermost rule of a precomputation counts relative to an unknown start: its bounds are
    // applied at run time.
    if (a_.rule(a_.state(target).rule).counted && t.parent != kBottom &&
        !a_.CountAllows(target, next.count)) {
      continue;
    }
    ClosureRec(next, pool, out);
  }
}

void Pda::Continue(int32_t parent, FramePool* pool, Config* out) {
  out->Clear();
  if (parent == kRoot) {
    out->complete = true;
    return;
  }
  visited_.clear();
  ClosureRec((*pool)[parent], pool, out);
}

void Pda::Start(FramePool* pool, Config* out) {
  out->Clear();
  visited_.clear();
  ClosureRec(Top{a_.rule(a_.root()).start, 0, kRoot}, pool, out);
}

}  // namespace dinfer::structured
