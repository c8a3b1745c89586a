// Serving one generation request: its prompt rendered and tokenized, its limits checked, the
// engine streams bridged to the HTTP exchange without blocking an I/O thread (the engine's
// ready callback posts the work to the connection's strand), and a client that goes away
// aborting its request. ServingContext is immutable once the model is loaded: thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dinfer/engine.h"
#include "server/chat_prompt.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/protocol/types.h"

namespace dinfer::server {

using Clock = std::chrono::steady_clock;

// Engine request ids of the generations in progress, so that a shutdown can abort them.
class ActiveRequests {
 public:
  void Add(int64_t id);
  void Remove(int64_t id);
  void AbortAll(Engine& engine);

 private:
  std::mutex mu_;
  std::set<int64_t> ids_;
};

struct ServingContext {
  std::shared_ptr<Engine> engine;
  ModelInfo info;
  std::string model_name;                              // the served name clients use
  std::shared_ptr<const ChatPromptRenderer> renderer;  // null: chat is not available, see below
  Status renderer_status;                              // why there is no renderer
  Metrics* metrics = nullptr;
  int64_t max_waiting = 0;                        // 0: no limit
  ErrorKind queue_full = ErrorKind::kOverloaded;  // what a request beyond max_waiting gets
  // Generation requests submitted and not finished.
  std::shared_ptr<std::atomic<int64_t>> in_flight;
  std::shared_ptr<ActiveRequests> active;
};

// Sends an error response in the protocol's shape and counts it.
void ReplyError(HttpExchange& exchange, Metrics& metrics, std::string_view endpoint, Api api,
                const ApiError& error);

// A prompt ready for the engine: its token ids and, for chat requests, the rendered segments
// (whose trusted markup tells the output parser where the model's output starts).
struct PreparedPrompt {
  std::vector<int32_t> ids;
  std::vector<PromptSegment> segments;
};

// Each of the request's prompts (one for chat requests), rendered and tokenized.
ApiResult<std::vector<PreparedPrompt>> TokenizePrompts(const ServingContext& ctx,
                                                       const GenerationRequest& req);

// Validates and submits the request, then answers on `exchange` (streamed or not). Returns at
// once; the response completes from the engine's callbacks.
void StartGeneration(std::shared_ptr<const ServingContext> ctx, GenerationRequest req,
                     std::shared_ptr<HttpExchange> exchange, std::string endpoint,
                     Clock::time_point arrival);

}  // namespace dinfer::server
