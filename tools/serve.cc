// `dinfer serve [MODEL]`: the OpenAI/Anthropic-compatible HTTP server (src/server).
#include <cstdio>

#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace dinfer::tools {

void AddServeFlags(CLI::App& cmd, ServeArgs& a) {
  server::ServerOptions& o = a.options;
  cmd.add_option("MODEL", a.positional_model,
                 "the model to serve (same as --model): \"default\", an HF model directory or a "
                 ".gguf file");
  AddEngineFlags(cmd, o.engine, kAllEngineFlags);
  cmd.add_option("--host", o.http.host, "address to listen on (0.0.0.0: every interface)")
      ->capture_default_str();
  cmd.add_option("--port", o.http.port, "port to listen on (0: any free port)")
      ->capture_default_str();
  cmd.add_option("--api-key", o.api_key,
                 "require this key: 'Authorization: Bearer KEY' (OpenAI clients) or 'x-api-key: "
                 "KEY' (Anthropic clients)")
      ->envname("DINFER_API_KEY");
  cmd.add_option("--served-model-name", o.served_model_name,
                 "the model name clients send (default: the model argument)");
  cmd.add_option("--chat-template", o.chat_template_file,
                 "a Jinja chat template file to use instead of the checkpoint's");
  cmd.add_option("--max-waiting", o.max_waiting,
                 "requests waiting for the engine before new ones are refused (0 = no limit)")
      ->capture_default_str();
  cmd.add_option("--queue-full-status", o.queue_full_status,
                 "HTTP status of requests refused because --max-waiting requests wait: 503 "
                 "(overloaded) or 429 (rate limited)")
      ->check(CLI::IsMember({503, 429}))
      ->capture_default_str();
  cmd.add_option("--max-request-mib", o.http.max_body_bytes,
                 "largest request body accepted, in MiB (larger ones get 413)")
      ->transform([](std::string s) { return std::to_string(std::stoull(s) << 20); })
      ->default_str("32");
  cmd.add_option("--io-threads", o.http.io_threads, "threads serving HTTP connections")
      ->capture_default_str();
  cmd.add_option("--shutdown-timeout", o.shutdown_timeout_s,
                 "on SIGINT/SIGTERM, seconds to let requests in progress finish before aborting "
                 "them")
      ->capture_default_str();
}

int RunServe(ServeArgs a) {
  if (!a.positional_model.empty()) a.options.engine.model = a.positional_model;
  if (a.options.http.io_threads < 1 || a.options.max_waiting < 0) {
    std::fprintf(stderr, "dinfer serve: --io-threads must be >= 1 and --max-waiting >= 0\n");
    return 2;
  }
  return server::RunServer(a.options);
}

}  // namespace dinfer::tools
