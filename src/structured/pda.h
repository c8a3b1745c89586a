// The pushdown runtime shared by mask precomputation and per-request matching. A configuration is
// the set of live stacks after some input, each stack given by its top (the state it can consume
// a byte in, a counter for counted rules, and its parent frame). Parent frames (where a called rule
// returns to) are hash-consed in a FramePool, so equal stacks are equal ids and sets of stacks
// stay small; frames created speculatively are undone in LIFO order. Two sentinels end a stack:
// kRoot (the root rule finishing completes the text) and kBottom (used when precomputing one
// rule's masks: finishing the rule is a "pop" whose continuation is unknown until run time).
// Not thread-safe: each matcher or precomputation owns its pool.
#pragma once

#include <cstdint>
#include <vector>

#include "structured/automaton.h"

namespace dinfer::structured {

inline constexpr int32_t kRoot = -1;
inline constexpr int32_t kBottom = -2;

struct Top {
  int32_t state;
  uint32_t count;
  int32_t parent;
  bool operator==(const Top&) const = default;
};

struct Config {
  std::vector<Top> tops;       // stacks that can consume a byte next
  bool complete = false;       // the root rule can finish here
  std::vector<uint32_t> pops;  // counts at which the kBottom rule finished (precomputation)
  void Clear() {
    tops.clear();
    complete = false;
    pops.clear();
  }
  bool Dead() const { return tops.empty() && !complete; }
};

class FramePool {
 public:
  FramePool();
  int32_t Intern(const Top& frame);
  const Top& operator[](int32_t id) const { return frames_[id]; }
  size_t size() const { return frames_.size(); }
  // Forgets every frame interned after size() was `mark`.
  void Undo(size_t mark);

 private:
  void Rehash();
  std::vector<Top> frames_;
  std::vector<uint32_t> slot_of_;
  std::vector<int32_t> table_;
};

class Pda {
 public:
  explicit Pda(const Automaton& a) : a_(a) {}

  // Adds the closure of `t` to `out`: t itself if it consumes bytes, the callers it returns to
  // if its state may finish, and the rules it calls.
  void Closure(const Top& t, FramePool* pool, Config* out);
  // The configuration after one byte; `out` is cleared first.
  void Step(const Config& in, uint8_t byte, FramePool* pool, Config* out);
  // The configuration right after the rule of a stack with parent `parent` finished.
  void Continue(int32_t parent, FramePool* pool, Config* out);
  // The configuration at the start of the text.
  void Start(FramePool* pool, Config* out);

  const Automaton& automaton() const { return a_; }

 private:
  void ClosureRec(Top t, FramePool* pool, Config* out);
  bool Visit(const Top& t);

  const Automaton& a_;
  std::vector<Top> visited_;
};

}  // namespace dinfer::structured
