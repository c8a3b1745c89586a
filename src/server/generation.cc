#include "server/generation.h"

#include <algorithm>
#include <ctime>

#include <fmt/format.h>

#include "base/logging.h"
#include "server/protocol/encoder.h"
#include "server/protocol/fields.h"
#include "server/protocol/output_pipeline.h"

namespace dinfer::server {

namespace {

ApiError FromStatus(const Status& s, std::string param = "") {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnimplemented:
    case StatusCode::kOutOfRange:
    case StatusCode::kNotFound:
      return ApiError{ErrorKind::kInvalidRequest, s.message(), std::move(param), ""};
    default:
      return ApiError{ErrorKind::kInternal, s.message(), "", ""};
  }
}

// The tools the model is shown: none with tool_choice "none".
const boost::json::array& RenderedTools(const GenerationRequest& req) {
  static const boost::json::array kNoTools;
  return req.tool_choice.mode == ToolChoice::Mode::kNone ? kNoTools : req.tools;
}

// How the model writes its output for this prompt: reasoning and tool-call markup (chat
// requests, from the template and the rendered prompt), and the request's stop sequences.
output::OutputFormat OutputFormatFor(const ServingContext& ctx, const GenerationRequest& req,
                                     const PreparedPrompt& prompt) {
  output::OutputFormat f;
  if (req.chat && ctx.renderer) {
    f = output::SelectOutputFormat(
        {ctx.info.architecture, ctx.renderer->chat_template(!RenderedTools(req).empty()),
         ctx.renderer->deepseek_v4()},
        prompt.segments);
    // Without declared tools a JSON answer is an answer, not a call.
    if (req.tools.empty() || req.tool_choice.mode == ToolChoice::Mode::kNone) {
      f.tools = output::ToolCallFormat::kNone;
    }
  }
  if (!req.structured_param.empty()) {
    // A constrained output starts with its first token: no reasoning, no markup of the model's.
    f.reasoning = output::ReasoningFormat::kNone;
    f.starts_in_reasoning = false;
    f.starts_in_tool_calls = false;
    f.tools = output::ToolCallFormat::kNone;
    // A forced call is written {"name": ..., "parameters": {...}} (ForceToolCall).
    if (req.structured_param == "tool_choice") f.tools = output::ToolCallFormat::kLlama3Json;
  }
  f.stop = req.stop;
  if (req.api == Api::kMessages) f.tool_call_id = [](int) { return NewId("toolu_"); };
  return f;
}

// One request's generation: its engine streams (one per prompt, each with n completions) and
// its choices. Everything but ScheduleDrain runs on the connection's strand. The call owns
// itself (self_) from Start until its response is complete or its client left.
class GenerationCall : public std::enable_shared_from_this<GenerationCall> {
 public:
  GenerationCall(std::shared_ptr<const ServingContext> ctx, GenerationRequest req,
                 std::shared_ptr<HttpExchange> exchange, std::string endpoint,
                 Clock::time_point arrival, std::vector<int64_t> prompt_sizes,
                 const std::vector<output::OutputFormat>& formats)
      : ctx_(std::move(ctx)),
        req_(std::move(req)),
        exchange_(std::move(exchange)),
        endpoint_(std::move(endpoint)),
        arrival_(arrival) {
    const int n = req_.sampling.n;
    encoder_ =
        MakeEncoder(req_, ResponseMeta{NewId(IdPrefix(req_.api)),
                                       static_cast<int64_t>(std::time(nullptr)), ctx_->model_name});
    std::shared_ptr<Engine> engine = ctx_->engine;
    DecodeFn decode = [engine](int32_t token) { return engine->Decode({token}); };
    for (size_t p = 0; p < prompt_sizes.size(); ++p) {
      prompts_.push_back(PromptState{nullptr, prompt_sizes[p], 0, n, n, false});
      for (int j = 0; j < n; ++j) {
        choices_.emplace_back(static_cast<int>(p) * n + j, req_, formats[p], decode);
      }
    }
    last_token_.resize(choices_.size());
    open_choices_ = static_cast<int>(choices_.size());
  }

  void Start(std::vector<std::shared_ptr<RequestStream>> streams) {
    self_ = shared_from_this();
    std::weak_ptr<GenerationCall> weak = weak_from_this();
    exchange_->OnDisconnect([weak] {
      if (auto call = weak.lock()) call->Disconnected();
    });
    for (size_t p = 0; p < streams.size(); ++p) {
      prompts_[p].stream = std::move(streams[p]);
      ctx_->active->Add(prompts_[p].stream->id());
    }
    for (PromptState& p : prompts_) {
      p.stream->SetReadyCallback([weak] {
        if (auto call = weak.lock()) call->ScheduleDrain();
      });
    }
  }

 private:
  struct PromptState {
    std::shared_ptr<RequestStream> stream;
    int64_t prompt_tokens, cached_tokens;
    int open_choices;  // choices not done
    int engine_open;   // completions the engine has not finished
    bool aborted;
  };

  static std::string_view IdPrefix(Api api) {
    switch (api) {
      case Api::kChatCompletions:
        return "chatcmpl-";
      case Api::kCompletions:
        return "cmpl-";
      case Api::kResponses:
        return "resp_";
      case Api::kMessages:
        return "msg_";
    }
    return "";
  }

  // Engine thread: at most one drain is queued at a time.
  void ScheduleDrain() {
    if (drain_posted_.exchange(true)) return;
    exchange_->Post([call = shared_from_this()] {
      call->drain_posted_ = false;
      call->Drain();
    });
  }

  void Drain() {
    for (size_t p = 0; p < prompts_.size() && !complete_; ++p) {
      while (!complete_) {
        std::optional<RequestOutput> out = prompts_[p].stream->TryNext();
        if (!out) break;
        Handle(p, *out);
      }
    }
    Flush();
  }

  void Flush() {
    if (!pending_.empty()) exchange_->Write(std::exchange(pending_, ""));
  }

  void Handle(size_t p, const RequestOutput& out) {
    PromptState& ps = prompts_[p];
    ps.prompt_tokens = std::max(ps.prompt_tokens, out.prompt_tokens);
    ps.cached_tokens = std::max(ps.cached_tokens, out.cached_prompt_tokens);
    if (out.finished) --ps.engine_open;
    const size_t index = p * static_cast<size_t>(req_.sampling.n) + static_cast<size_t>(out.index);
    if (index >= choices_.size()) return;
    ChoiceOutput& choice = choices_[index];
    if (choice.done()) return;  // a stop string ended it; the engine is catching up
    // The engine refused the request before generating anything: the request fails as a whole.
    if (out.finish_reason == "error" && !started_ && out.token_ids.empty()) {
      return Fail(ApiError{ErrorKind::kInvalidRequest, out.error, "", ""});
    }
    if (!started_) Begin();
    ObserveTokens(index, static_cast<int64_t>(out.token_ids.size()));
    const ChoiceUpdate update = choice.Process(out);
    if (req_.stream) encoder_->StreamUpdate(update, pending_);
    if (!choice.done()) return;
    --open_choices_;
    if (--ps.open_choices == 0 && ps.engine_open > 0 && !ps.aborted) {
      // Every choice of this prompt is done, some on a stop string: free the KV now.
      ps.aborted = true;
      ctx_->engine->Abort(ps.stream->id());
    }
    if (open_choices_ == 0) Complete();
  }

  void ObserveTokens(size_t index, int64_t tokens) {
    if (tokens == 0) return;
    const Clock::time_point now = Clock::now();
    if (!first_token_) {
      first_token_ = now;
      ctx_->metrics->ObserveTimeToFirstToken(std::chrono::duration<double>(now - arrival_).count());
    }
    if (last_token_[index]) {
      ctx_->metrics->ObserveTimePerOutputToken(
          std::chrono::duration<double>(now - *last_token_[index]).count(), tokens);
    } else if (tokens > 1) {
      ctx_->metrics->ObserveTimePerOutputToken(0.0, tokens - 1);
    }
    last_token_[index] = now;
  }

  Usage Totals() const {
    Usage u;
    for (const PromptState& p : prompts_) {
      u.prompt_tokens += p.prompt_tokens;
      u.cached_tokens += p.cached_tokens;
    }
    for (const ChoiceOutput& c : choices_) {
      u.completion_tokens += c.result().completion_tokens;
      u.reasoning_tokens += c.result().reasoning_tokens;
    }
    return u;
  }

  void Begin() {
    started_ = true;
    if (!req_.stream) return;
    exchange_->BeginStream(200, "text/event-stream");
    encoder_->StreamStart(Totals(), pending_);
  }

  void Complete() {
    const Usage usage = Totals();
    if (req_.stream) {
      encoder_->StreamEnd(usage, pending_);
      Flush();
      exchange_->End();
      ctx_->metrics->RecordRequest(endpoint_, 200);
    } else {
      std::vector<ChoiceResult> results;
      const ChoiceResult* failed = nullptr;
      for (const ChoiceOutput& c : choices_) {
        results.push_back(c.result());
        if (c.result().finish == Finish::kError) failed = &c.result();
      }
      if (failed != nullptr) {
        ReplyError(*exchange_, *ctx_->metrics, endpoint_, req_.api,
                   ApiError{ErrorKind::kInternal, failed->error, "", ""});
      } else {
        exchange_->Reply(200, "application/json", encoder_->Body(results, usage));
        ctx_->metrics->RecordRequest(endpoint_, 200);
      }
    }
    ctx_->metrics->AddTokens(usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens);
    ctx_->metrics->ObserveRequestLatency(
        std::chrono::duration<double>(Clock::now() - arrival_).count());
    End();
  }

  void Fail(const ApiError& error) {
    ReplyError(*exchange_, *ctx_->metrics, endpoint_, req_.api, error);
    End();
  }

  void Disconnected() {
    if (complete_) return;
    ctx_->metrics->RecordRequest(endpoint_, 499);  // nginx's "client closed request"
    End();
  }

  // The response is over (or nobody reads it): abort what still runs and let go of the call.
  void End() {
    complete_ = true;
    for (PromptState& p : prompts_) {
      if (!p.aborted && p.engine_open > 0) {
        p.aborted = true;
        ctx_->engine->Abort(p.stream->id());
      }
      ctx_->active->Remove(p.stream->id());
    }
    ctx_->in_flight->fetch_sub(1);
    self_.reset();
  }

  std::shared_ptr<const ServingContext> ctx_;
  GenerationRequest req_;
  std::shared_ptr<HttpExchange> exchange_;
  std::string endpoint_;
  Clock::time_point arrival_;
  std::unique_ptr<ResponseEncoder> encoder_;
  std::vector<PromptState> prompts_;
  std::vector<ChoiceOutput> choices_;
  std::vector<std::optional<Clock::time_point>> last_token_;
  std::optional<Clock::time_point> first_token_;
  std::string pending_;  // events not yet handed to the exchange
  std::atomic<bool> drain_posted_{false};
  std::shared_ptr<GenerationCall> self_;
  int open_choices_ = 0;
  bool started_ = false, complete_ = false;
};

}  // namespace

void ActiveRequests::Add(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  ids_.insert(id);
}

void ActiveRequests::Remove(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  ids_.erase(id);
}

void ActiveRequests::AbortAll(Engine& engine) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t id : ids_) engine.Abort(id);
}

void ReplyError(HttpExchange& exchange, Metrics& metrics, std::string_view endpoint, Api api,
                const ApiError& error) {
  const unsigned status = HttpStatus(error.kind);
  HttpHeaders headers;
  if (error.kind == ErrorKind::kOverloaded || error.kind == ErrorKind::kRateLimited) {
    headers.emplace_back("Retry-After", "1");
  }
  exchange.Reply(status, "application/json", ErrorBody(api, error), std::move(headers));
  metrics.RecordRequest(endpoint, status);
}

ApiResult<std::vector<PreparedPrompt>> TokenizePrompts(const ServingContext& ctx,
                                                       const GenerationRequest& req) {
  std::vector<PreparedPrompt> out;
  const Engine& engine = *ctx.engine;
  if (req.chat) {
    if (!ctx.renderer) return FromStatus(ctx.renderer_status, "messages");
    auto segments =
        ctx.renderer->Render(ChatRenderRequest{req.messages, RenderedTools(req), req.tool_choice,
                                               req.template_kwargs, req.continue_final_message});
    if (!segments.ok()) return FromStatus(segments.status(), "messages");
    auto ids = engine.EncodeSegments(*segments);
    if (!ids.ok()) return FromStatus(ids.status(), "messages");
    out.push_back({std::move(ids).value(), std::move(segments).value()});
    return out;
  }
  for (const PromptInput& p : req.prompts) {
    if (!p.ids.empty()) {
      for (int32_t id : p.ids) {
        if (id >= ctx.info.vocab_size) {
          return InvalidParam("prompt", fmt::format("token id {} is outside the vocabulary (size "
                                                    "{})",
                                                    id, ctx.info.vocab_size));
        }
      }
      out.push_back({p.ids, {}});
      continue;
    }
    // Like the engine's own text prompts: BOS first when the tokenizer adds one.
    auto ids = engine.Encode(ctx.info.add_bos_token ? ctx.info.bos_token + p.text : p.text);
    if (!ids.ok()) return FromStatus(ids.status(), "prompt");
    out.push_back({std::move(ids).value(), {}});
  }
  return out;
}

void StartGeneration(std::shared_ptr<const ServingContext> ctx, GenerationRequest req,
                     std::shared_ptr<HttpExchange> exchange, std::string endpoint,
                     Clock::time_point arrival) {
  auto fail = [&](const ApiError& e) {
    ReplyError(*exchange, *ctx->metrics, endpoint, req.api, e);
  };
  Engine& engine = *ctx->engine;
  if (ctx->max_waiting > 0) {
    // The engine's count lags behind submissions by a step; requests submitted and not yet
    // running are waiting too.
    const EngineStatsSnapshot stats = engine.Stats();
    const int64_t waiting = std::max(stats.waiting, ctx->in_flight->load() - stats.running);
    if (waiting >= ctx->max_waiting) {
      return fail(ApiError{ctx->queue_full,
                           fmt::format("the server is at capacity ({} requests waiting); retry "
                                       "later",
                                       waiting),
                           "", ""});
    }
  }
  if (req.continue_final_message && !req.structured_param.empty()) {
    return fail(InvalidParam(req.structured_param,
                             fmt::format("'{}' constrains the whole answer, so it cannot continue "
                                         "a prefilled assistant message",
                                         req.structured_param)));
  }
  auto prompts = TokenizePrompts(*ctx, req);
  if (!prompts.ok()) return fail(prompts.error());
  const int64_t max_len = ctx->info.max_model_len;
  std::vector<RequestSpec> specs;
  std::vector<int64_t> sizes;
  std::vector<output::OutputFormat> formats;
  std::string constraint_param = req.structured_param;  // named when the engine refuses it
  for (PreparedPrompt& prompt : *prompts) {
    std::vector<int32_t>& ids = prompt.ids;
    const auto n = static_cast<int64_t>(ids.size());
    const std::string param = req.chat ? "messages" : "prompt";
    if (n == 0) return fail(InvalidParam(param, "the prompt is empty"));
    if (n >= max_len || (req.max_tokens && n + *req.max_tokens > max_len)) {
      ApiError e = InvalidParam(
          param, req.max_tokens
                     ? fmt::format("this model's maximum context length is {} tokens; the prompt "
                                   "has {} tokens and max_tokens asks for {} more ({} in total)",
                                   max_len, n, *req.max_tokens, n + *req.max_tokens)
                     : fmt::format("this model's maximum context length is {} tokens; the prompt "
                                   "has {} tokens, which leaves none to generate",
                                   max_len, n));
      e.code = "context_length_exceeded";
      return fail(e);
    }
    RequestSpec spec;
    spec.sampling = req.sampling;
    spec.sampling.temperature = req.temperature.value_or(ctx->info.temperature);
    spec.sampling.top_p = req.top_p.value_or(ctx->info.top_p);
    spec.sampling.top_k = req.top_k.value_or(ctx->info.top_k);
    spec.sampling.max_tokens = req.max_tokens.value_or(max_len - n);
    spec.sampling.logprobs = req.logprobs ? req.top_logprobs : -1;
    formats.push_back(OutputFormatFor(*ctx, req, prompt));
    // Strict tools, tool_choice auto: calls the model writes are constrained, text stays free.
    if (req.structured_param.empty() && req.tool_choice.mode == ToolChoice::Mode::kAuto &&
        formats.back().tools == output::ToolCallFormat::kHermes && HasStrictTool(req.tools)) {
      spec.sampling.structured = {"structural_tag", HermesToolCallTag(req.tools), {}, 16};
      constraint_param = "tools";
    }
    spec.prompt_ids = std::move(ids);
    sizes.push_back(n);
    specs.push_back(std::move(spec));
  }
  if (req.echo) {
    for (size_t i = 0; i < req.prompts.size(); ++i) {
      if (req.prompts[i].text.empty()) req.prompts[i].text = engine.Decode(specs[i].prompt_ids);
    }
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const RequestSpec& spec : specs) {
    auto stream = engine.Submit(spec);
    if (!stream.ok()) {
      for (const auto& s : streams) engine.Abort(s->id());
      return fail(FromStatus(stream.status(), constraint_param));
    }
    streams.push_back(std::move(stream).value());
  }
  ctx->in_flight->fetch_add(1);
  auto call =
      std::make_shared<GenerationCall>(ctx, std::move(req), std::move(exchange),
                                       std::move(endpoint), arrival, std::move(sizes), formats);
  call->Start(std::move(streams));
}

}  // namespace dinfer::server
