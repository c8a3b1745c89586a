// /v1/messages (Anthropic Messages API): `system` and content blocks (text, tool_use,
// tool_result, thinking) become chat messages; output is content blocks, streamed as
// message_start / content_block_* / message_delta / message_stop events.
#include "server/protocol/anthropic.h"

#include <fmt/format.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "server/protocol/fields.h"
#include "server/protocol/openai.h"

namespace dinfer::server {

namespace json = boost::json;

namespace {

constexpr size_t kMaxStopSequences = 16;

// Text of a tool_result's content: a string or text blocks.
bool ToolResultText(FieldReader& r, std::string_view param, const json::value* content,
                    std::string& out) {
  if (content == nullptr) return true;
  return ContentText(r, param, *content, {"text"}, out);
}

bool ReadMessages(FieldReader& r, GenerationRequest& req) {
  const json::array* messages = r.Array("messages");
  if (!r.ok()) return false;
  if (messages == nullptr || messages->empty()) {
    return r.Fail("messages", "'messages' must be a non-empty array");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string param = fmt::format("messages[{}]", i);
    if (!(*messages)[i].is_object()) {
      return r.Fail(param, fmt::format("'{}' must be an object", param));
    }
    FieldReader mr((*messages)[i].get_object(), param + ".");
    auto fail = [&] { return r.Fail(mr.error().param, mr.error().message); };
    const std::string role = mr.String("role").value_or("");
    if (role != "user" && role != "assistant") {
      return r.Fail(param + ".role",
                    fmt::format("'{}.role' must be \"user\" or \"assistant\"", param));
    }
    const json::value* content = mr.Get("content");
    if (content == nullptr) {
      return r.Fail(param + ".content", fmt::format("'{}.content' is required", param));
    }
    if (content->is_string()) {
      req.messages.push_back(json::object{{"role", role}, {"content", content->get_string()}});
      continue;
    }
    if (!content->is_array()) {
      return r.Fail(param + ".content",
                    fmt::format("'{}.content' must be a string or an array of blocks", param));
    }
    std::string text, thinking;
    json::array tool_calls;
    auto flush_text = [&] {
      if (role == "user" && !text.empty()) {
        req.messages.push_back(json::object{{"role", "user"}, {"content", text}});
        text.clear();
      }
    };
    const json::array& blocks = content->get_array();
    for (size_t j = 0; j < blocks.size(); ++j) {
      const std::string bp = fmt::format("{}.content[{}]", param, j);
      if (!blocks[j].is_object()) return r.Fail(bp, fmt::format("'{}' must be an object", bp));
      FieldReader br(blocks[j].get_object(), bp + ".");
      const std::string type = br.String("type").value_or("");
      if (type == "text") {
        const auto t = br.String("text");
        if (!t) return r.Fail(bp + ".text", fmt::format("'{}.text' must be a string", bp));
        if (!text.empty()) text += "\n";
        text += *t;
      } else if (type == "thinking" && role == "assistant") {
        thinking += br.String("thinking").value_or("");
      } else if (type == "redacted_thinking" && role == "assistant") {
        continue;
      } else if (type == "tool_use" && role == "assistant") {
        const auto id = br.String("id");
        const auto name = br.String("name");
        const json::object* input = br.Object("input");
        if (!br.ok()) return r.Fail(br.error().param, br.error().message);
        if (!id || !name) return r.Fail(bp, fmt::format("'{}' needs 'id' and 'name'", bp));
        tool_calls.push_back(json::object{
            {"id", *id},
            {"type", "function"},
            {"function",
             json::object{{"name", *name},
                          {"arguments", json::serialize(input ? *input : json::object{})}}}});
      } else if (type == "tool_result" && role == "user") {
        const auto id = br.String("tool_use_id");
        std::string result;
        if (!id)
          return r.Fail(bp + ".tool_use_id", fmt::format("'{}.tool_use_id' is required", bp));
        if (!ToolResultText(br, "content", br.Get("content"), result)) {
          return r.Fail(br.error().param, br.error().message);
        }
        flush_text();
        req.messages.push_back(
            json::object{{"role", "tool"}, {"tool_call_id", *id}, {"content", result}});
      } else {
        return r.Fail(bp + ".type", fmt::format("content block type '{}' is not supported in {} "
                                                "messages",
                                                std::string_view(type), role));
      }
      if (!br.ok()) return r.Fail(br.error().param, br.error().message);
    }
    if (!mr.ok()) return fail();
    if (role == "user") {
      flush_text();
    } else {
      json::object m{{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) m["reasoning_content"] = thinking;
      if (!tool_calls.empty()) m["tool_calls"] = std::move(tool_calls);
      req.messages.push_back(std::move(m));
    }
  }
  return true;
}

void ReadSystem(FieldReader& r, GenerationRequest& req) {
  const json::value* system = r.Get("system");
  if (system == nullptr) return;
  std::string text;
  if (!ContentText(r, "system", *system, {"text"}, text)) return;
  req.messages.push_back(json::object{{"role", "system"}, {"content", text}});
}

// Anthropic tools ({"name", "description", "input_schema"}) in the chat shape; tool_choice
// {"type": "auto" | "any" | "tool" | "none"} in the chat vocabulary.
void ReadTools(FieldReader& r, const json::object& body, GenerationRequest& req) {
  json::object chat;
  if (const json::array* tools = r.Array("tools")) {
    json::array converted;
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string p = fmt::format("tools[{}]", i);
      if (!(*tools)[i].is_object()) {
        r.Fail(p, fmt::format("'{}' must be an object", p));
        return;
      }
      const json::object& t = (*tools)[i].get_object();
      if (const json::value* type = t.if_contains("type");
          type != nullptr && !type->is_null() && *type != "custom") {
        r.Fail(p + ".type", "only custom (client) tools are supported, not server tools");
        return;
      }
      json::object fn;
      if (const json::value* v = t.if_contains("name")) fn["name"] = *v;
      if (const json::value* v = t.if_contains("description")) fn["description"] = *v;
      if (const json::value* v = t.if_contains("input_schema")) fn["parameters"] = *v;
      if (const json::value* v = t.if_contains("strict")) fn["strict"] = *v;
      converted.push_back(json::object{{"type", "function"}, {"function", std::move(fn)}});
    }
    chat["tools"] = std::move(converted);
  }
  if (const json::object* choice = r.Object("tool_choice")) {
    const json::value* type = choice->if_contains("type");
    const std::string_view t = type != nullptr && type->is_string() ? type->get_string() : "";
    if (t == "auto" || t == "none") {
      chat["tool_choice"] = t;
    } else if (t == "any") {
      chat["tool_choice"] = "required";
    } else if (t == "tool") {
      const json::value* name = choice->if_contains("name");
      chat["tool_choice"] = json::object{
          {"type", "function"}, {"function", json::object{{"name", name ? *name : nullptr}}}};
    } else {
      r.Fail("tool_choice.type", "'tool_choice.type' must be auto, any, tool or none");
      return;
    }
  }
  FieldReader cr(chat);
  ReadChatTools(cr, req);
  if (!cr.ok()) {
    std::string param = cr.error().param;
    if (const size_t at = param.find(".function."); at != std::string::npos) {
      param.replace(at, std::string_view(".function.parameters").size(), ".input_schema");
    }
    r.Fail(param, cr.error().message);
  }
}

void ReadThinking(FieldReader& r, GenerationRequest& req) {
  const json::object* thinking = r.Object("thinking");
  if (thinking == nullptr) return;
  FieldReader tr(*thinking, "thinking.");
  const std::string type = tr.String("type").value_or("");
  if (type == "enabled" || type == "adaptive") {
    req.template_kwargs["enable_thinking"] = true;
    req.template_kwargs["thinking"] = true;
    if (auto budget = tr.Int("budget_tokens", 1, INT32_MAX)) {
      if (req.max_tokens && *budget >= *req.max_tokens) {
        tr.Fail("budget_tokens", "'thinking.budget_tokens' must be less than 'max_tokens'");
      }
    }
  } else if (type == "disabled") {
    req.template_kwargs["enable_thinking"] = false;
    req.template_kwargs["thinking"] = false;
  } else {
    tr.Fail("type", "'thinking.type' must be \"enabled\", \"adaptive\" or \"disabled\"");
  }
  if (!tr.ok()) r.Fail(tr.error().param, tr.error().message);
}

ApiResult<GenerationRequest> Parse(const json::object& body, bool count_only) {
  GenerationRequest req;
  req.api = Api::kMessages;
  req.chat = true;
  req.include_usage = true;
  FieldReader r(body);
  if (auto model = r.String("model")) req.model = *model;
  ReadSystem(r, req);
  ReadMessages(r, req);
  ReadTools(r, body, req);
  if (!count_only) {
    req.max_tokens = r.Int("max_tokens", 1, INT32_MAX);
    if (r.ok() && !req.max_tokens) r.Fail("max_tokens", "'max_tokens' is required");
    req.temperature = r.Number("temperature", 0.0, 1.0);
    req.top_p = r.Number("top_p", 0.0, 1.0);
    if (auto k = r.Int("top_k", 0, 1 << 30)) req.top_k = static_cast<int>(*k);
    ReadStopStrings(r, "stop_sequences", kMaxStopSequences, req.stop);
    req.stream = r.Bool("stream").value_or(false);
  }
  ReadThinking(r, req);
  // A final assistant message is the start of the answer: the model continues it.
  req.continue_final_message =
      !req.messages.empty() && req.messages.back().at("role") == "assistant";
  if (const json::object* config = r.Object("output_config")) {
    FieldReader cr(*config, "output_config.");
    if (auto effort = cr.String("effort")) req.template_kwargs["reasoning_effort"] = *effort;
    // {"type": "json_schema", "schema": {...}}: the text is an instance of the schema.
    if (const json::object* format = cr.Object("format")) {
      const json::value* type = format->if_contains("type");
      if (type == nullptr || !type->is_string() || type->get_string() != "json_schema") {
        cr.Fail("format", "'output_config.format.type' must be json_schema");
      } else {
        ReadJsonSchemaFormat(r, "output_config.format", *format, req);
      }
    }
    if (!cr.ok()) r.Fail(cr.error().param, cr.error().message);
  }
  if (!r.ok()) return r.error();
  return req;
}

json::object UsageJson(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens - u.cached_tokens},
          {"output_tokens", u.completion_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", u.cached_tokens}};
}

const char* StopReason(Finish finish) {
  switch (finish) {
    case Finish::kStopSequence:
      return "stop_sequence";
    case Finish::kLength:
      return "max_tokens";
    case Finish::kToolCalls:
      return "tool_use";
    default:
      return "end_turn";
  }
}

// Tool arguments as the object Anthropic clients expect; text that is not a JSON object (a
// model's malformed call) is kept under "_raw" rather than dropped.
json::object ToolInput(const std::string& arguments) {
  boost::system::error_code ec;
  json::value v = json::parse(arguments, ec);
  if (!ec && v.is_object()) return std::move(v.get_object());
  return json::object{{"_raw", arguments}};
}

class MessagesEncoder final : public ResponseEncoder {
 public:
  explicit MessagesEncoder(ResponseMeta meta) : meta_(std::move(meta)) {}

  void StreamStart(const Usage& usage, std::string& out) override {
    json::object message = Message(json::array{}, nullptr, nullptr, usage);
    AppendEvent(out, "message_start", {{"type", "message_start"}, {"message", std::move(message)}});
    AppendEvent(out, "ping", {{"type", "ping"}});
  }

  void StreamUpdate(const ChoiceUpdate& u, std::string& out) override {
    for (const OutputEvent& e : u.events) {
      switch (e.type) {
        case OutputEvent::Type::kReasoning:
          OpenBlock(Block::kThinking, out,
                    {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
          Delta(out, {{"type", "thinking_delta"}, {"thinking", e.text}});
          break;
        case OutputEvent::Type::kText:
          OpenBlock(Block::kText, out, {{"type", "text"}, {"text", ""}});
          Delta(out, {{"type", "text_delta"}, {"text", e.text}});
          break;
        case OutputEvent::Type::kToolCallBegin:
          CloseBlock(out);
          OpenBlock(
              Block::kToolUse, out,
              {{"type", "tool_use"}, {"id", e.id}, {"name", e.name}, {"input", json::object{}}});
          break;
        case OutputEvent::Type::kToolCallArgs:
          if (open_ == Block::kToolUse)
            Delta(out, {{"type", "input_json_delta"}, {"partial_json", e.text}});
          break;
        case OutputEvent::Type::kToolCallEnd:
        case OutputEvent::Type::kStop:  // the update's finish carries it
          break;
      }
    }
    if (u.finish == Finish::kError) {
      StreamError(ApiError{ErrorKind::kInternal, u.error, "", ""}, out);
    } else if (u.finish != Finish::kNone) {
      CloseBlock(out);
      finish_ = u.finish;
      stop_sequence_ = u.stop_sequence;
    }
  }

  void StreamEnd(const Usage& usage, std::string& out) override {
    if (failed_) return;
    AppendEvent(out, "message_delta",
                {{"type", "message_delta"},
                 {"delta", json::object{{"stop_reason", StopReason(finish_)},
                                        {"stop_sequence", StopSequence()}}},
                 {"usage", UsageJson(usage)}});
    AppendEvent(out, "message_stop", {{"type", "message_stop"}});
  }

  void StreamError(const ApiError& error, std::string& out) override {
    failed_ = true;
    out += "event: error\ndata: " + ErrorBody(Api::kMessages, error) + "\n\n";
  }

  std::string Body(const std::vector<ChoiceResult>& choices, const Usage& usage) override {
    const ChoiceResult& c = choices.front();
    json::array content;
    if (!c.reasoning.empty()) {
      content.push_back(
          json::object{{"type", "thinking"}, {"thinking", c.reasoning}, {"signature", ""}});
    }
    if (!c.text.empty() || c.tool_calls.empty()) {
      content.push_back(json::object{{"type", "text"}, {"text", c.text}});
    }
    for (const ToolCall& t : c.tool_calls) {
      content.push_back(json::object{
          {"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", ToolInput(t.arguments)}});
    }
    finish_ = c.finish;
    stop_sequence_ = c.stop_sequence;
    return json::serialize(Message(std::move(content), StopReason(finish_), StopSequence(), usage));
  }

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };

  json::value StopSequence() const {
    return finish_ == Finish::kStopSequence ? json::value(stop_sequence_) : json::value(nullptr);
  }

  json::object Message(json::array content, json::value stop_reason, json::value stop_sequence,
                       const Usage& usage) const {
    return {{"id", meta_.id},
            {"type", "message"},
            {"role", "assistant"},
            {"model", meta_.model},
            {"content", std::move(content)},
            {"stop_reason", std::move(stop_reason)},
            {"stop_sequence", std::move(stop_sequence)},
            {"usage", UsageJson(usage)}};
  }

  void OpenBlock(Block kind, std::string& out, json::object block) {
    if (open_ == kind && kind != Block::kToolUse) return;
    CloseBlock(out);
    open_ = kind;
    AppendEvent(
        out, "content_block_start",
        {{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
  }

  void Delta(std::string& out, json::object delta) {
    AppendEvent(out, "content_block_delta",
                {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(delta)}});
  }

  void CloseBlock(std::string& out) {
    if (open_ == Block::kNone) return;
    AppendEvent(out, "content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
    ++index_;
    open_ = Block::kNone;
  }

  ResponseMeta meta_;
  Block open_ = Block::kNone;
  int64_t index_ = 0;
  Finish finish_ = Finish::kNone;
  std::string stop_sequence_;
  bool failed_ = false;
};

}  // namespace

ApiResult<GenerationRequest> ParseMessages(const json::object& body) { return Parse(body, false); }

ApiResult<GenerationRequest> ParseCountTokens(const json::object& body) {
  return Parse(body, true);
}

std::unique_ptr<ResponseEncoder> MakeMessagesEncoder(ResponseMeta meta) {
  return std::make_unique<MessagesEncoder>(std::move(meta));
}

}  // namespace dinfer::server
