// `dinfer serve`: the OpenAI- and Anthropic-compatible API server. The listener starts before the
// model loads (/health answers 503 until it has); SIGINT or SIGTERM stop it gracefully (no new
// connections, requests in progress finish, up to a timeout). RunServer owns every thread it
// starts and returns when the server has stopped.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "dinfer/engine.h"
#include "server/http_server.h"

namespace dinfer::server {

struct ServerOptions {
  HttpServerOptions http;
  EngineOptions engine;
  std::string api_key;             // empty: no authentication
  std::string served_model_name;   // empty: the model argument
  std::string chat_template_file;  // a Jinja chat template replacing the checkpoint's
  int64_t max_waiting = 1024;      // requests waiting for the engine before 503s (0: no limit)
  int queue_full_status = 503;     // the HTTP status of those: 503 or 429
  double shutdown_timeout_s = 30.0;
};

// Serves until SIGINT/SIGTERM; returns the process exit code (non-zero if the model failed to
// load or the port could not be bound). `on_listening`, if set, is called with the bound port.
int RunServer(const ServerOptions& options, std::function<void(uint16_t)> on_listening = {});

}  // namespace dinfer::server
