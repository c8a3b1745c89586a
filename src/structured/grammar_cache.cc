#include "structured/grammar_cache.h"

namespace dinfer::structured {

GrammarCache::GrammarCache(std::shared_ptr<const TokenIndex> tokens, int threads, size_t capacity)
    : compiler_(std::move(tokens)), capacity_(std::max<size_t>(capacity, 1)) {
  for (int i = 0; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { Work(); });
}

GrammarCache::~GrammarCache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void GrammarCache::Work() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

std::shared_future<CompileResult> GrammarCache::Get(const Constraint& constraint) {
  std::string key = ConstraintKey(constraint);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.pos);
    return it->second.result;
  }
  auto promise = std::make_shared<std::promise<CompileResult>>();
  std::shared_future<CompileResult> result = promise->get_future().share();
  queue_.push_back([this, constraint, promise] {
    auto grammar = BuildGrammar(constraint);
    promise->set_value(grammar.ok() ? compiler_.Compile(*grammar)
                                    : CompileResult(grammar.status()));
  });
  lru_.push_back(key);
  entries_.emplace(std::move(key), Entry{result, std::prev(lru_.end())});
  while (entries_.size() > capacity_) {
    entries_.erase(lru_.front());
    lru_.pop_front();
  }
  cv_.notify_one();
  return result;
}

}  // namespace dinfer::structured
