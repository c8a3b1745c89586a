// /v1/chat/completions: request parsing and the chat.completion / chat.completion.chunk shapes.
#include <fmt/format.h>

#include <boost/json/serialize.hpp>

#include "server/protocol/fields.h"
#include "server/protocol/openai.h"

namespace dinfer::server {

namespace json = boost::json;

namespace {

constexpr size_t kMaxStopStrings = 16;

bool ReadMessages(FieldReader& r, GenerationRequest& req) {
  const json::array* messages = r.Array("messages");
  if (!r.ok()) return false;
  if (messages == nullptr || messages->empty()) {
    return r.Fail("messages", "'messages' must be a non-empty array");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string param = fmt::format("messages[{}]", i);
    const json::value& m = (*messages)[i];
    if (!m.is_object()) return r.Fail(param, fmt::format("'{}' must be an object", param));
    FieldReader mr(m.get_object(), param + ".");
    const std::optional<std::string> role = mr.String("role");
    if (!mr.ok()) return r.Fail(mr.error().param, mr.error().message);
    if (!role) return r.Fail(param + ".role", fmt::format("'{}.role' is required", param));
    static constexpr std::string_view kRoles[] = {"system", "developer", "user", "assistant",
                                                  "tool"};
    if (std::find(std::begin(kRoles), std::end(kRoles), *role) == std::end(kRoles)) {
      return r.Fail(param + ".role",
                    fmt::format("'{}.role' must be one of system, developer, user, assistant, "
                                "tool; got '{}'",
                                param, *role));
    }
    json::object out;
    // Chat templates know "system"; "developer" is the newer name of the same role.
    out["role"] = *role == "developer" ? "system" : *role;
    std::string text;
    if (const json::value* content = mr.Get("content")) {
      if (!ContentText(mr, "content", *content, {"text"}, text)) {
        return r.Fail(mr.error().param, mr.error().message);
      }
      out["content"] = text;
    } else if (*role != "assistant") {
      return r.Fail(param + ".content", fmt::format("'{}.content' is required", param));
    } else {
      out["content"] = "";
    }
    if (*role == "assistant") {
      if (const json::array* calls = mr.Array("tool_calls")) {
        for (size_t j = 0; j < calls->size(); ++j) {
          const std::string cp = fmt::format("{}.tool_calls[{}]", param, j);
          const json::value& c = (*calls)[j];
          const json::object* fn = nullptr;
          if (c.is_object()) {
            const json::value* f = c.get_object().if_contains("function");
            if (f != nullptr && f->is_object()) fn = &f->get_object();
          }
          if (fn == nullptr || !fn->contains("name") || !(*fn).at("name").is_string()) {
            return r.Fail(cp, fmt::format("'{}' must be {{\"id\", \"type\": \"function\", "
                                          "\"function\": {{\"name\", \"arguments\"}}}}",
                                          cp));
          }
          const json::value* args = fn->if_contains("arguments");
          if (args != nullptr && !args->is_string()) {
            return r.Fail(cp + ".function.arguments",
                          fmt::format("'{}.function.arguments' must be a JSON string", cp));
          }
        }
        out["tool_calls"] = *calls;
      }
      if (auto reasoning = mr.String("reasoning_content")) out["reasoning_content"] = *reasoning;
    }
    if (*role == "tool") {
      if (auto id = mr.String("tool_call_id")) out["tool_call_id"] = *id;
    }
    if (auto name = mr.String("name")) out["name"] = *name;
    if (!mr.ok()) return r.Fail(mr.error().param, mr.error().message);
    req.messages.push_back(std::move(out));
  }
  return true;
}

// Unset, {"type": "text"}: plain text; {"type": "json_object"}: any JSON object;
// {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}: an instance of the schema.
void ReadResponseFormat(FieldReader& r, GenerationRequest& req) {
  const json::object* format = r.Object("response_format");
  if (format == nullptr) return;
  const json::value* type = format->if_contains("type");
  if (type == nullptr || !type->is_string()) {
    r.Fail("response_format", "'response_format.type' must be a string");
    return;
  }
  const std::string_view t = type->get_string();
  if (t == "text") return;
  if (t == "json_object") {
    ReadJsonObjectFormat(r, "response_format", req);
  } else if (t == "structural_tag") {
    ReadStructuralTagFormat(r, "response_format", *format, req);
  } else if (t == "json_schema") {
    const json::value* spec = format->if_contains("json_schema");
    if (spec == nullptr || !spec->is_object()) {
      r.Fail("response_format.json_schema",
             "'response_format.json_schema' must be an object with a 'schema'");
      return;
    }
    ReadJsonSchemaFormat(r, "response_format.json_schema", spec->get_object(), req);
  } else {
    r.Fail("response_format",
           fmt::format("'response_format.type' must be text, json_object, json_schema or "
                       "structural_tag, got '{}'",
                       t));
  }
}

json::object LogprobsJson(const std::vector<LogprobEntry>& entries) {
  return {{"content", TokenLogprobsJson(entries)}, {"refusal", nullptr}};
}

class ChatEncoder final : public ResponseEncoder {
 public:
  ChatEncoder(const GenerationRequest& req, ResponseMeta meta)
      : meta_(std::move(meta)),
        n_(req.sampling.n),
        include_usage_(req.include_usage),
        logprobs_(req.logprobs) {}

  void StreamStart(const Usage&, std::string& out) override {
    for (int i = 0; i < n_; ++i) {
      Chunk(out, i, json::object{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
    }
  }

  void StreamUpdate(const ChoiceUpdate& u, std::string& out) override {
    json::object delta;
    std::string text, reasoning;
    json::array calls;
    for (const OutputEvent& e : u.events) {
      switch (e.type) {
        case OutputEvent::Type::kText:
          text += e.text;
          break;
        case OutputEvent::Type::kReasoning:
          reasoning += e.text;
          break;
        case OutputEvent::Type::kToolCallBegin:
          calls.push_back(
              json::object{{"index", e.tool_index},
                           {"id", e.id},
                           {"type", "function"},
                           {"function", json::object{{"name", e.name}, {"arguments", ""}}}});
          break;
        case OutputEvent::Type::kToolCallArgs:
          calls.push_back(json::object{{"index", e.tool_index},
                                       {"function", json::object{{"arguments", e.text}}}});
          break;
        case OutputEvent::Type::kToolCallEnd:
        case OutputEvent::Type::kStop:  // the update's finish carries it
          break;
      }
    }
    if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
    if (!text.empty()) delta["content"] = text;
    if (!calls.empty()) delta["tool_calls"] = std::move(calls);
    json::value logprobs = nullptr;
    if (logprobs_ && !u.logprobs.empty()) logprobs = LogprobsJson(u.logprobs);
    if (!delta.empty() || !logprobs.is_null()) {
      Chunk(out, u.index, std::move(delta), std::move(logprobs), nullptr);
    }
    if (u.finish == Finish::kError) {
      StreamError(ApiError{ErrorKind::kInternal, u.error, "", ""}, out);
    } else if (u.finish != Finish::kNone) {
      Chunk(out, u.index, json::object{}, nullptr, OpenAiFinishReason(u.finish));
    }
  }

  void StreamEnd(const Usage& usage, std::string& out) override {
    if (include_usage_) {
      json::object chunk = Head();
      chunk["choices"] = json::array{};
      chunk["usage"] = OpenAiUsage(usage);
      AppendEvent(out, "", chunk);
    }
    out += "data: [DONE]\n\n";
  }

  void StreamError(const ApiError& error, std::string& out) override {
    out += "data: " + ErrorBody(Api::kChatCompletions, error) + "\n\n";
  }

  std::string Body(const std::vector<ChoiceResult>& results, const Usage& usage) override {
    json::array choices;
    for (const ChoiceResult& c : results) {
      json::object message{{"role", "assistant"}};
      message["content"] =
          c.text.empty() && !c.tool_calls.empty() ? json::value(nullptr) : json::value(c.text);
      if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.empty()) {
        json::array calls;
        for (const ToolCall& t : c.tool_calls) {
          calls.push_back(json::object{
              {"id", t.id},
              {"type", "function"},
              {"function", json::object{{"name", t.name}, {"arguments", t.arguments}}}});
        }
        message["tool_calls"] = std::move(calls);
      }
      choices.push_back(json::object{
          {"index", c.index},
          {"message", std::move(message)},
          {"logprobs", logprobs_ ? json::value(LogprobsJson(c.logprobs)) : json::value(nullptr)},
          {"finish_reason", OpenAiFinishReason(c.finish)}});
    }
    json::object body{
        {"id", meta_.id},       {"object", "chat.completion"},   {"created", meta_.created},
        {"model", meta_.model}, {"choices", std::move(choices)}, {"usage", OpenAiUsage(usage)}};
    return json::serialize(body);
  }

 private:
  json::object Head() const {
    return {{"id", meta_.id},
            {"object", "chat.completion.chunk"},
            {"created", meta_.created},
            {"model", meta_.model}};
  }

  void Chunk(std::string& out, int index, json::object delta, json::value logprobs,
             json::value finish_reason) {
    json::object chunk = Head();
    chunk["choices"] = json::array{json::object{{"index", index},
                                                {"delta", std::move(delta)},
                                                {"logprobs", std::move(logprobs)},
                                                {"finish_reason", std::move(finish_reason)}}};
    AppendEvent(out, "", chunk);
  }

  ResponseMeta meta_;
  int n_;
  bool include_usage_, logprobs_;
};

}  // namespace

bool ContentText(FieldReader& r, std::string_view param, const json::value& content,
                 std::initializer_list<std::string_view> text_types, std::string& out) {
  if (content.is_string()) {
    out = content.get_string();
    return true;
  }
  if (!content.is_array()) {
    return r.Fail(param, fmt::format("'{}' must be a string or an array of content parts, got {}",
                                     r.Name(param), TypeName(content)));
  }
  const json::array& parts = content.get_array();
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string pp = fmt::format("{}[{}]", param, i);
    const json::value& part = parts[i];
    const json::value* type = part.is_object() ? part.get_object().if_contains("type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      return r.Fail(pp, fmt::format("'{}' must be an object with a string 'type'", r.Name(pp)));
    }
    const std::string_view t = type->get_string();
    if (std::find(text_types.begin(), text_types.end(), t) == text_types.end()) {
      return r.Fail(pp,
                    fmt::format("content type '{}' is not supported: this server takes text", t));
    }
    const json::value* text = part.get_object().if_contains("text");
    if (text == nullptr || !text->is_string()) {
      return r.Fail(pp + ".text", fmt::format("'{}.text' must be a string", r.Name(pp)));
    }
    // Parts are joined by newlines, as separate paragraphs of one message.
    if (i > 0) out += "\n";
    out += text->get_string();
  }
  return true;
}

void ReadChatTools(FieldReader& r, GenerationRequest& req) {
  if (const json::array* tools = r.Array("tools")) {
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string p = fmt::format("tools[{}]", i);
      const json::value& t = (*tools)[i];
      const json::object* fn = nullptr;
      if (t.is_object() && t.get_object().contains("function") &&
          t.get_object().at("function").is_object()) {
        fn = &t.get_object().at("function").get_object();
      }
      const json::value* type = t.is_object() ? t.get_object().if_contains("type") : nullptr;
      if (type == nullptr || !type->is_string() || type->get_string() != "function") {
        r.Fail(p + ".type", fmt::format("'{}.type' must be \"function\"", p));
        return;
      }
      const json::value* name = fn ? fn->if_contains("name") : nullptr;
      if (name == nullptr || !name->is_string() || name->get_string().empty()) {
        r.Fail(p + ".function.name", fmt::format("'{}.function.name' must be a string", p));
        return;
      }
      const json::value* params = fn->if_contains("parameters");
      if (params != nullptr && !params->is_object() && !params->is_null()) {
        r.Fail(p + ".function.parameters",
               fmt::format("'{}.function.parameters' must be a JSON Schema object", p));
        return;
      }
      req.tools.push_back(t);
    }
  }
  const json::value* choice = r.Get("tool_choice");
  if (choice == nullptr) {
    req.tool_choice.mode = ToolChoice::Mode::kAuto;
  } else if (choice->is_string()) {
    const std::string_view c = choice->get_string();
    if (c == "auto") {
      req.tool_choice.mode = ToolChoice::Mode::kAuto;
    } else if (c == "none") {
      req.tool_choice.mode = ToolChoice::Mode::kNone;
    } else if (c == "required") {
      req.tool_choice.mode = ToolChoice::Mode::kRequired;
    } else {
      r.Fail("tool_choice",
             fmt::format("'tool_choice' must be \"auto\", \"none\", \"required\" or a named "
                         "function, got '{}'",
                         c));
      return;
    }
  } else {
    const json::value* name = nullptr;
    if (choice->is_object()) {
      const json::object& o = choice->get_object();
      // Chat: {"type": "function", "function": {"name"}}; Responses: {"type": "function", "name"}.
      if (const json::value* fn = o.if_contains("function"); fn != nullptr && fn->is_object()) {
        name = fn->get_object().if_contains("name");
      } else {
        name = o.if_contains("name");
      }
    }
    if (name == nullptr || !name->is_string()) {
      r.Fail("tool_choice",
             "'tool_choice' must name a function: {\"type\": \"function\", "
             "\"function\": {\"name\": ...}}");
      return;
    }
    req.tool_choice.mode = ToolChoice::Mode::kNamed;
    req.tool_choice.name = name->get_string();
  }
  if (req.tool_choice.mode == ToolChoice::Mode::kNamed) {
    bool found = false;
    for (const json::value& t : req.tools) {
      const json::object& o = t.get_object();
      const json::value& fn = o.contains("function") ? o.at("function") : t;
      found |= fn.get_object().at("name").get_string() == req.tool_choice.name;
    }
    if (!found) {
      r.Fail("tool_choice", fmt::format("'tool_choice' names '{}', which is not in 'tools'",
                                        req.tool_choice.name));
      return;
    }
  }
  ForceToolCall(r, req);
}

ApiResult<GenerationRequest> ParseChatCompletion(const json::object& body) {
  GenerationRequest req;
  req.api = Api::kChatCompletions;
  req.chat = true;
  FieldReader r(body);
  if (auto model = r.String("model")) req.model = *model;
  ReadMessages(r, req);
  ReadSamplingFields(r, req);
  ReadChatTools(r, req);
  ReadResponseFormat(r, req);
  ReadStopStrings(r, "stop", kMaxStopStrings, req.stop);
  const auto max_tokens = r.Int("max_tokens", 1, INT32_MAX);
  const auto max_completion_tokens = r.Int("max_completion_tokens", 1, INT32_MAX);
  req.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  if (auto n = r.Int("n", 1, 128)) req.sampling.n = static_cast<int>(*n);
  req.stream = r.Bool("stream").value_or(false);
  if (const json::object* so = r.Object("stream_options")) {
    if (!req.stream) r.Fail("stream_options", "'stream_options' is only allowed with stream");
    FieldReader sr(*so, "stream_options.");
    req.include_usage = sr.Bool("include_usage").value_or(false);
    if (!sr.ok()) r.Fail(sr.error().param, sr.error().message);
  }
  req.logprobs = r.Bool("logprobs").value_or(false);
  if (auto top = r.Int("top_logprobs", 0, 20)) {
    if (!req.logprobs) r.Fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    req.top_logprobs = static_cast<int>(*top);
  }
  if (auto effort = r.String("reasoning_effort")) req.template_kwargs["reasoning_effort"] = *effort;
  if (const json::object* kwargs = r.Object("chat_template_kwargs")) {
    for (const auto& [k, v] : *kwargs) req.template_kwargs[k] = v;
  }
  if (r.Get("audio") != nullptr) r.Fail("audio", "audio output is not supported");
  req.continue_final_message = r.Bool("continue_final_message").value_or(false);
  if (r.ok() && req.continue_final_message && req.messages.back().at("role") != "assistant") {
    r.Fail("continue_final_message", "'continue_final_message' needs an assistant message last");
  }
  if (!r.ok()) return r.error();
  return req;
}

std::unique_ptr<ResponseEncoder> MakeChatEncoder(const GenerationRequest& req, ResponseMeta meta) {
  return std::make_unique<ChatEncoder>(req, std::move(meta));
}

json::array TokenLogprobsJson(const std::vector<LogprobEntry>& entries) {
  auto bytes = [](const std::string& s) {
    json::array b;
    for (unsigned char c : s) b.push_back(c);
    return b;
  };
  json::array out;
  for (const LogprobEntry& e : entries) {
    json::array top;
    for (const auto& [token, lp] : e.top) {
      top.push_back(json::object{{"token", token}, {"logprob", lp}, {"bytes", bytes(token)}});
    }
    out.push_back(json::object{{"token", e.token},
                               {"logprob", e.logprob},
                               {"bytes", bytes(e.token)},
                               {"top_logprobs", std::move(top)}});
  }
  return out;
}

json::object OpenAiUsage(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", json::object{{"cached_tokens", u.cached_tokens}}},
          {"completion_tokens_details", json::object{{"reasoning_tokens", u.reasoning_tokens}}}};
}

const char* OpenAiFinishReason(Finish finish) {
  switch (finish) {
    case Finish::kEndOfSequence:
    case Finish::kStopSequence:
      return "stop";
    case Finish::kLength:
      return "length";
    case Finish::kToolCalls:
      return "tool_calls";
    case Finish::kAbort:
      return "abort";
    case Finish::kError:
      return "error";
    case Finish::kNone:
      break;
  }
  return "stop";
}

}  // namespace dinfer::server
