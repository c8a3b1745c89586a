// Routing, authentication, the small endpoints (/health, /metrics, /v1/models, count_tokens),
// model loading behind a live listener, and graceful shutdown.
#include "server/api_server.h"

#include <condition_variable>
#include <csignal>
#include <ctime>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <boost/asio/signal_set.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/json/serialize.hpp>

#include "base/logging.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/protocol/anthropic.h"
#include "server/protocol/encoder.h"
#include "server/protocol/fields.h"
#include "server/protocol/openai.h"
#include "server/protocol/responses.h"

namespace dinfer::server {

namespace json = boost::json;
namespace http = boost::beast::http;

namespace {

// Compares without an early exit, so response times do not reveal how much of a key matched.
bool SameSecret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

struct Route {
  std::string_view path;
  http::verb method;
  Api api;
};

constexpr Route kGenerationRoutes[] = {
    {"/v1/chat/completions", http::verb::post, Api::kChatCompletions},
    {"/v1/completions", http::verb::post, Api::kCompletions},
    {"/v1/responses", http::verb::post, Api::kResponses},
    {"/v1/messages", http::verb::post, Api::kMessages},
};

class ApiServer {
 public:
  explicit ApiServer(ServerOptions options) : o_(std::move(options)) {
    if (o_.served_model_name.empty()) o_.served_model_name = o_.engine.model;
  }

  int Run(const std::function<void(uint16_t)>& on_listening) {
    if (!o_.chat_template_file.empty()) {
      std::ifstream f(o_.chat_template_file, std::ios::binary);
      std::stringstream text;
      text << f.rdbuf();
      if (!f) {
        log::Error("dinfer serve: cannot read --chat-template '{}'", o_.chat_template_file);
        return 1;
      }
      chat_template_ = text.str();
    }
    HttpServer http(
        o_.http,
        [this](HttpRequest req, std::shared_ptr<HttpExchange> ex) {
          Handle(std::move(req), std::move(ex));
        },
        [this](const std::string& target, unsigned status, const std::string& message,
               HttpExchange& ex) {
          const Api api = ErrorApi(target);
          ApiError e{status == 413 ? ErrorKind::kRequestTooLarge : ErrorKind::kInvalidRequest,
                     message, "", ""};
          ex.Reply(status, "application/json", ErrorBody(api, e));
          metrics_.RecordRequest(EndpointLabel(target), status);
        });
    http_ = &http;
    if (Status s = http.Start(); !s.ok()) {
      log::Error("dinfer serve: {}", s.ToString());
      return 1;
    }
    log::Info("listening on http://{}:{} (model '{}' is loading)", o_.http.host, http.port(),
              o_.served_model_name);
    if (on_listening) on_listening(http.port());

    boost::asio::signal_set signals(http.io_context(), SIGINT, SIGTERM);
    signals.async_wait([this](const boost::system::error_code& ec, int signal) {
      if (ec) return;
      log::Info("signal {}: shutting down", signal);
      Notify([&] { stop_requested_ = true; });
    });
    std::thread loader([this] { Load(); });

    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_requested_ || load_failed_; });
    }
    const bool failed = load_failed_;
    loader.join();
    Shutdown(http);
    signals.cancel();
    http.Stop();
    http_ = nullptr;
    return failed ? 1 : 0;
  }

 private:
  template <typename Fn>
  void Notify(Fn&& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn();
    }
    cv_.notify_all();
  }

  void Load() {
    EngineOptions eo = o_.engine;
    eo.show_progress = false;
    auto engine = Engine::Create(eo);
    if (!engine.ok()) {
      log::Error("dinfer serve: {}", engine.status().ToString());
      Notify([&] { load_failed_ = true; });
      return;
    }
    auto ctx = std::make_shared<ServingContext>();
    ctx->engine = std::shared_ptr<Engine>(std::move(engine).value());
    ctx->info = ctx->engine->model_info();
    ctx->model_name = o_.served_model_name;
    auto renderer = MakeChatPromptRenderer(ctx->info, chat_template_);
    if (renderer.ok()) {
      ctx->renderer = std::move(renderer).value();
    } else {
      ctx->renderer_status = renderer.status();
      log::Warn("chat endpoints are unavailable: {}", renderer.status().message());
    }
    ctx->metrics = &metrics_;
    ctx->max_waiting = o_.max_waiting;
    ctx->queue_full =
        o_.queue_full_status == 429 ? ErrorKind::kRateLimited : ErrorKind::kOverloaded;
    ctx->in_flight = std::make_shared<std::atomic<int64_t>>(0);
    ctx->active = std::make_shared<ActiveRequests>();
    log::Info("model '{}' loaded ({}, context {} tokens): serving", o_.served_model_name,
              ctx->info.architecture, ctx->info.max_model_len);
    std::lock_guard<std::mutex> lock(mu_);
    ctx_ = std::move(ctx);
  }

  // Finishes what is in progress (up to the timeout), then aborts the rest.
  void Shutdown(HttpServer& http) {
    http.StopAccepting();
    auto wait_idle = [&](double seconds) {
      const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
      while (http.active_exchanges() > 0 && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    };
    wait_idle(o_.shutdown_timeout_s);
    std::shared_ptr<const ServingContext> ctx = Context();
    if (ctx && http.active_exchanges() > 0) {
      log::Warn("aborting {} requests still in progress", http.active_exchanges());
      ctx->active->AbortAll(*ctx->engine);
      wait_idle(2.0);
    }
  }

  std::shared_ptr<const ServingContext> Context() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ctx_;
  }

  static Api ErrorApi(std::string_view path) {
    return path.rfind("/v1/messages", 0) == 0 ? Api::kMessages : Api::kChatCompletions;
  }

  static std::string EndpointLabel(std::string_view path) {
    for (std::string_view known :
         {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages/count_tokens",
          "/v1/messages", "/v1/models", "/health", "/metrics"}) {
      if (path == known) return std::string(known);
    }
    if (path.rfind("/v1/models/", 0) == 0) return "/v1/models";
    return "other";
  }

  bool Authorized(const HttpRequest& req) const {
    if (o_.api_key.empty()) return true;
    const std::string_view bearer = req[http::field::authorization];
    if (bearer.size() > 7 && boost::beast::iequals(bearer.substr(0, 7), "Bearer ") &&
        SameSecret(bearer.substr(7), o_.api_key)) {
      return true;
    }
    const std::string_view x_api_key = req["x-api-key"];
    return !x_api_key.empty() && SameSecret(x_api_key, o_.api_key);
  }

  void Handle(HttpRequest req, std::shared_ptr<HttpExchange> ex) {
    const Clock::time_point arrival = Clock::now();
    std::string_view target = req.target();
    const std::string_view path = target.substr(0, target.find('?'));
    const std::string endpoint = EndpointLabel(path);
    const Api api = ErrorApi(path);
    auto fail = [&](ApiError e) { ReplyError(*ex, metrics_, endpoint, api, e); };
    std::shared_ptr<const ServingContext> ctx = Context();

    if (path == "/health") {
      if (ctx) {
        ex->Reply(200, "application/json", R"({"status":"ok"})");
      } else {
        ex->Reply(503, "application/json", R"({"status":"loading"})");
      }
      return metrics_.RecordRequest(endpoint, ctx ? 200 : 503);
    }
    if (path == "/metrics") {
      std::optional<EngineStatsSnapshot> stats;
      if (ctx) stats = ctx->engine->Stats();
      ex->Reply(200, "text/plain; version=0.0.4; charset=utf-8",
                metrics_.Render(stats ? &*stats : nullptr, http_->active_exchanges()));
      return metrics_.RecordRequest(endpoint, 200);
    }
    if (path.rfind("/v1/", 0) != 0) {
      return fail(
          ApiError{ErrorKind::kNotFound, fmt::format("no such endpoint: {}", path), "", ""});
    }
    if (!Authorized(req)) {
      return fail(ApiError{ErrorKind::kAuthentication,
                           api == Api::kMessages ? "invalid x-api-key"
                                                 : "incorrect API key provided: send it as "
                                                   "'Authorization: Bearer <key>'",
                           "", ""});
    }
    if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
      if (req.method() != http::verb::get) return MethodNotAllowed(*ex, endpoint, api);
      return Models(req, path, *ex, endpoint);
    }
    const bool count_tokens = path == "/v1/messages/count_tokens";
    const Route* route = nullptr;
    for (const Route& r : kGenerationRoutes) {
      if (path == r.path) route = &r;
    }
    if (route == nullptr && !count_tokens) {
      return fail(
          ApiError{ErrorKind::kNotFound, fmt::format("no such endpoint: {}", path), "", ""});
    }
    if (req.method() != http::verb::post) return MethodNotAllowed(*ex, endpoint, api);
    if (!ctx) {
      return fail(
          ApiError{ErrorKind::kOverloaded, "the model is still loading; retry shortly", "", ""});
    }
    auto body = ParseBody(req.body());
    if (!body.ok()) return fail(body.error());
    ApiResult<GenerationRequest> parsed = ApiError{};
    if (count_tokens) {
      parsed = ParseCountTokens(*body);
    } else {
      switch (route->api) {
        case Api::kChatCompletions:
          parsed = ParseChatCompletion(*body);
          break;
        case Api::kCompletions:
          parsed = ParseCompletion(*body);
          break;
        case Api::kResponses:
          parsed = ParseResponsesRequest(*body);
          break;
        case Api::kMessages:
          parsed = ParseMessages(*body);
          break;
      }
    }
    if (!parsed.ok()) return fail(parsed.error());
    if (!parsed->model.empty() && parsed->model != ctx->model_name) {
      ApiError e{ErrorKind::kNotFound,
                 fmt::format("the model '{}' does not exist: this server serves '{}'",
                             parsed->model, ctx->model_name),
                 "model", ""};
      return fail(e);
    }
    if (count_tokens) {
      auto prompts = TokenizePrompts(*ctx, *parsed);
      if (!prompts.ok()) return fail(prompts.error());
      ex->Reply(200, "application/json",
                json::serialize(json::object{
                    {"input_tokens", static_cast<int64_t>(prompts->front().ids.size())}}));
      return metrics_.RecordRequest(endpoint, 200);
    }
    StartGeneration(ctx, std::move(*parsed), std::move(ex), endpoint, arrival);
  }

  void MethodNotAllowed(HttpExchange& ex, const std::string& endpoint, Api api) {
    const std::string body =
        ErrorBody(api, ApiError{ErrorKind::kInvalidRequest, "method not allowed", "", ""});
    ex.Reply(405, "application/json", body);
    metrics_.RecordRequest(endpoint, 405);
  }

  // The OpenAI list shape, or Anthropic's when the client says it speaks that protocol.
  void Models(const HttpRequest& req, std::string_view path, HttpExchange& ex,
              const std::string& endpoint) {
    const bool anthropic = !req["anthropic-version"].empty();
    const std::string_view id =
        path.size() > std::string_view("/v1/models/").size() ? path.substr(11) : "";
    if (!id.empty() && id != o_.served_model_name) {
      return ReplyError(ex, metrics_, endpoint, anthropic ? Api::kMessages : Api::kChatCompletions,
                        ApiError{ErrorKind::kNotFound,
                                 fmt::format("the model '{}' does not exist", id), "model", ""});
    }
    std::shared_ptr<const ServingContext> ctx = Context();
    json::object model;
    if (anthropic) {
      model = {{"type", "model"},
               {"id", o_.served_model_name},
               {"display_name", o_.served_model_name},
               {"created_at", "1970-01-01T00:00:00Z"}};
    } else {
      model = {{"id", o_.served_model_name},
               {"object", "model"},
               {"created", started_at_},
               {"owned_by", "dinfer"}};
      if (ctx) model["max_model_len"] = ctx->info.max_model_len;
    }
    json::value out = model;
    if (id.empty()) {
      out = anthropic ? json::object{{"data", json::array{model}},
                                     {"has_more", false},
                                     {"first_id", o_.served_model_name},
                                     {"last_id", o_.served_model_name}}
                      : json::object{{"object", "list"}, {"data", json::array{model}}};
    }
    ex.Reply(200, "application/json", json::serialize(out));
    metrics_.RecordRequest(endpoint, 200);
  }

  ServerOptions o_;
  std::string chat_template_;  // --chat-template's contents
  Metrics metrics_;
  HttpServer* http_ = nullptr;
  const int64_t started_at_ = static_cast<int64_t>(std::time(nullptr));
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<const ServingContext> ctx_;  // null while loading
  bool stop_requested_ = false, load_failed_ = false;
};

}  // namespace

int RunServer(const ServerOptions& options, std::function<void(uint16_t)> on_listening) {
  ApiServer server(options);
  return server.Run(on_listening);
}

}  // namespace dinfer::server
