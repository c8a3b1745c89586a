// GrammarCache: compiles constraints for one tokenizer on its own worker threads, off the caller's
// path, and keeps the results (successes and refusals) keyed by the constraint, so that requests
// with the same schema share one CompiledGrammar. Get() returns at once with a future.
// Thread-safe: any thread may call Get().
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "structured/compiler.h"
#include "structured/constraint.h"

namespace dinfer::structured {

using CompileResult = StatusOr<std::shared_ptr<const CompiledGrammar>>;

class GrammarCache {
 public:
  // `capacity`: compiled grammars kept (least recently used dropped first).
  GrammarCache(std::shared_ptr<const TokenIndex> tokens, int threads = 2, size_t capacity = 512);
  ~GrammarCache();
  GrammarCache(const GrammarCache&) = delete;
  GrammarCache& operator=(const GrammarCache&) = delete;

  std::shared_future<CompileResult> Get(const Constraint& constraint);

  const GrammarCompiler& compiler() const { return compiler_; }

 private:
  void Work();

  GrammarCompiler compiler_;
  size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::list<std::string> lru_;  // least recently used first
  struct Entry {
    std::shared_future<CompileResult> result;
    std::list<std::string>::iterator pos;
  };
  std::unordered_map<std::string, Entry> entries_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace dinfer::structured
