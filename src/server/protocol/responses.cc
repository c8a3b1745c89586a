// /v1/responses (OpenAI Responses API): `input` items and `instructions` become chat messages;
// output is a list of items (reasoning, message, function_call), streamed as semantic events
// with sequence numbers. Nothing is stored: each request carries its whole conversation.
#include "server/protocol/responses.h"

#include <fmt/format.h>

#include <boost/json/serialize.hpp>

#include "server/protocol/fields.h"
#include "server/protocol/openai.h"

namespace dinfer::server {

namespace json = boost::json;

namespace {

bool ReadInputItems(FieldReader& r, const json::array& items, json::array& messages) {
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string param = fmt::format("input[{}]", i);
    if (!items[i].is_object()) return r.Fail(param, fmt::format("'{}' must be an object", param));
    FieldReader ir(items[i].get_object(), param + ".");
    const std::string type = ir.String("type").value_or("message");
    auto fail = [&] { return r.Fail(ir.error().param, ir.error().message); };
    if (type == "message") {
      const std::string role = ir.String("role").value_or("");
      if (role != "user" && role != "assistant" && role != "system" && role != "developer") {
        return r.Fail(param + ".role",
                      fmt::format("'{}.role' must be user, assistant, system or developer", param));
      }
      const json::value* content = ir.Get("content");
      if (content == nullptr) {
        return r.Fail(param + ".content", fmt::format("'{}.content' is required", param));
      }
      std::string text;
      if (!ContentText(ir, "content", *content, {"input_text", "output_text", "text"}, text)) {
        return fail();
      }
      messages.push_back(
          json::object{{"role", role == "developer" ? "system" : role}, {"content", text}});
    } else if (type == "function_call") {
      const auto call_id = ir.String("call_id");
      const auto name = ir.String("name");
      const auto arguments = ir.String("arguments");
      if (!ir.ok()) return fail();
      if (!call_id || !name) {
        return r.Fail(param, fmt::format("'{}' needs 'call_id' and 'name'", param));
      }
      json::object call{
          {"id", *call_id},
          {"type", "function"},
          {"function", json::object{{"name", *name}, {"arguments", arguments.value_or("{}")}}}};
      // Consecutive calls belong to one assistant turn.
      json::object* last = messages.empty() ? nullptr : messages.back().if_object();
      if (last != nullptr && last->at("role") == "assistant" && last->contains("tool_calls")) {
        last->at("tool_calls").get_array().push_back(std::move(call));
      } else {
        messages.push_back(json::object{
            {"role", "assistant"}, {"content", ""}, {"tool_calls", json::array{std::move(call)}}});
      }
    } else if (type == "function_call_output") {
      const auto call_id = ir.String("call_id");
      const json::value* output = ir.Get("output");
      std::string text;
      if (!call_id || output == nullptr) {
        return r.Fail(param, fmt::format("'{}' needs 'call_id' and 'output'", param));
      }
      if (!ContentText(ir, "output", *output, {"input_text", "output_text", "text"}, text)) {
        return fail();
      }
      messages.push_back(
          json::object{{"role", "tool"}, {"tool_call_id", *call_id}, {"content", text}});
    } else if (type != "reasoning") {
      // Earlier reasoning items are accepted and left out: chat templates drop past reasoning.
      return r.Fail(param + ".type",
                    fmt::format("input item type '{}' is not supported", std::string_view(type)));
    }
    if (!ir.ok()) return fail();
  }
  return true;
}

// Responses tools are flat ({"type": "function", "name", "parameters"}); the chat shape nests
// them under "function".
void ReadTools(FieldReader& r, const json::object& body, GenerationRequest& req) {
  json::object chat;
  if (const json::array* tools = r.Array("tools")) {
    json::array converted;
    for (size_t i = 0; i < tools->size(); ++i) {
      const json::value& t = (*tools)[i];
      const json::value* type = t.is_object() ? t.get_object().if_contains("type") : nullptr;
      if (type == nullptr || !type->is_string() || type->get_string() != "function") {
        r.Fail(fmt::format("tools[{}].type", i),
               "only function tools are supported (no built-in tools such as web search)");
        return;
      }
      json::object fn;
      for (const char* key : {"name", "description", "parameters", "strict"}) {
        if (const json::value* v = t.get_object().if_contains(key)) fn[key] = *v;
      }
      converted.push_back(json::object{{"type", "function"}, {"function", std::move(fn)}});
    }
    chat["tools"] = std::move(converted);
  }
  if (const json::value* choice = body.if_contains("tool_choice")) chat["tool_choice"] = *choice;
  FieldReader cr(chat);
  ReadChatTools(cr, req);
  if (!cr.ok()) {
    std::string param = cr.error().param;
    // Report the request's own field names.
    if (const size_t at = param.find(".function."); at != std::string::npos) {
      param.erase(at, std::string_view(".function").size());
    }
    r.Fail(param, cr.error().message);
  }
}

json::object UsageJson(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens},
          {"input_tokens_details", json::object{{"cached_tokens", u.cached_tokens}}},
          {"output_tokens", u.completion_tokens},
          {"output_tokens_details", json::object{{"reasoning_tokens", u.reasoning_tokens}}},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json::object MessageItem(const std::string& id, const std::string& text, bool done,
                         json::array logprobs = {}) {
  json::array content;
  if (done) {
    content.push_back(json::object{{"type", "output_text"},
                                   {"text", text},
                                   {"annotations", json::array{}},
                                   {"logprobs", std::move(logprobs)}});
  }
  return {{"type", "message"},
          {"id", id},
          {"status", done ? "completed" : "in_progress"},
          {"role", "assistant"},
          {"content", std::move(content)}};
}

json::object ReasoningItem(const std::string& id, const std::string& text, bool done) {
  json::array content;
  if (done) content.push_back(json::object{{"type", "reasoning_text"}, {"text", text}});
  return {{"type", "reasoning"},
          {"id", id},
          {"summary", json::array{}},
          {"content", std::move(content)}};
}

json::object FunctionCallItem(const std::string& id, const std::string& call_id,
                              const std::string& name, const std::string& arguments, bool done) {
  return {{"type", "function_call"}, {"id", id},
          {"call_id", call_id},      {"name", name},
          {"arguments", arguments},  {"status", done ? "completed" : "in_progress"}};
}

class ResponsesEncoder final : public ResponseEncoder {
 public:
  ResponsesEncoder(const GenerationRequest& req, ResponseMeta meta)
      : meta_(std::move(meta)), echo_(req.echo_fields) {}

  void StreamStart(const Usage&, std::string& out) override {
    Emit(out, "response.created", {{"response", Object("in_progress", nullptr)}});
    Emit(out, "response.in_progress", {{"response", Object("in_progress", nullptr)}});
  }

  void StreamUpdate(const ChoiceUpdate& u, std::string& out) override {
    json::array pending_logprobs = TokenLogprobsJson(u.logprobs);
    for (const OutputEvent& e : u.events) {
      switch (e.type) {
        case OutputEvent::Type::kReasoning:
          OpenItem(ItemKind::kReasoning, out);
          text_ += e.text;
          Emit(out, "response.reasoning_text.delta",
               {{"item_id", item_id_},
                {"output_index", OutputIndex()},
                {"content_index", 0},
                {"delta", e.text}});
          break;
        case OutputEvent::Type::kText: {
          OpenItem(ItemKind::kMessage, out);
          text_ += e.text;
          // The update's tokens go with its first piece of text (updates are a token or a few).
          json::array lp = std::move(pending_logprobs);
          pending_logprobs = {};
          for (const json::value& v : lp) logprobs_.push_back(v);
          Emit(out, "response.output_text.delta",
               {{"item_id", item_id_},
                {"output_index", OutputIndex()},
                {"content_index", 0},
                {"delta", e.text},
                {"logprobs", std::move(lp)}});
          break;
        }
        case OutputEvent::Type::kToolCallBegin:
          Close(out);
          open_ = ItemKind::kFunctionCall;
          item_id_ = NewId("fc_");
          call_id_ = e.id;
          call_name_ = e.name;
          text_.clear();
          Emit(out, "response.output_item.added",
               {{"output_index", OutputIndex()},
                {"item", FunctionCallItem(item_id_, call_id_, call_name_, "", false)}});
          break;
        case OutputEvent::Type::kToolCallArgs:
          if (open_ != ItemKind::kFunctionCall) break;
          text_ += e.text;
          Emit(out, "response.function_call_arguments.delta",
               {{"item_id", item_id_}, {"output_index", OutputIndex()}, {"delta", e.text}});
          break;
        case OutputEvent::Type::kToolCallEnd:
          if (open_ == ItemKind::kFunctionCall) Close(out);
          break;
        case OutputEvent::Type::kStop:  // the update's finish carries it
          break;
      }
    }
    // Tokens that produced no text here (an end-of-sequence token) still belong to the message.
    if (open_ == ItemKind::kMessage) {
      for (const json::value& v : pending_logprobs) logprobs_.push_back(v);
    }
    if (u.finish == Finish::kError) {
      StreamError(ApiError{ErrorKind::kInternal, u.error, "", ""}, out);
    } else if (u.finish != Finish::kNone) {
      Close(out);
      finish_ = u.finish;
    }
  }

  void StreamEnd(const Usage& usage, std::string& out) override {
    if (failed_) return;
    const bool incomplete = finish_ == Finish::kLength;
    Emit(out, incomplete ? "response.incomplete" : "response.completed",
         {{"response", Object(incomplete ? "incomplete" : "completed", UsageJson(usage))}});
  }

  void StreamError(const ApiError& error, std::string& out) override {
    failed_ = true;
    json::object response = Object("failed", nullptr);
    response["error"] = json::object{{"code", "server_error"}, {"message", error.message}};
    Emit(out, "response.failed", {{"response", std::move(response)}});
  }

  std::string Body(const std::vector<ChoiceResult>& choices, const Usage& usage) override {
    const ChoiceResult& c = choices.front();
    if (!c.reasoning.empty()) output_.push_back(ReasoningItem(NewId("rs_"), c.reasoning, true));
    if (!c.text.empty() || c.tool_calls.empty()) {
      output_.push_back(MessageItem(NewId("msg_"), c.text, true, TokenLogprobsJson(c.logprobs)));
    }
    for (const ToolCall& t : c.tool_calls) {
      output_.push_back(FunctionCallItem(NewId("fc_"), t.id, t.name, t.arguments, true));
    }
    finish_ = c.finish;
    return json::serialize(
        Object(finish_ == Finish::kLength ? "incomplete" : "completed", UsageJson(usage)));
  }

 private:
  enum class ItemKind { kNone, kReasoning, kMessage, kFunctionCall };

  int64_t OutputIndex() const { return static_cast<int64_t>(output_.size()); }

  void Emit(std::string& out, std::string_view type, const json::object& data) {
    json::object event{{"type", type}};
    for (const auto& member : data) event.emplace(member.key(), member.value());
    event["sequence_number"] = sequence_++;
    AppendEvent(out, type, event);
  }

  // Starts an item of `kind` unless one is open already.
  void OpenItem(ItemKind kind, std::string& out) {
    if (open_ == kind) return;
    Close(out);
    open_ = kind;
    text_.clear();
    logprobs_ = {};
    const bool message = kind == ItemKind::kMessage;
    item_id_ = NewId(message ? "msg_" : "rs_");
    Emit(out, "response.output_item.added",
         {{"output_index", OutputIndex()},
          {"item",
           message ? MessageItem(item_id_, "", false) : ReasoningItem(item_id_, "", false)}});
    json::object part = message ? json::object{{"type", "output_text"},
                                               {"text", ""},
                                               {"annotations", json::array{}},
                                               {"logprobs", json::array{}}}
                                : json::object{{"type", "reasoning_text"}, {"text", ""}};
    Emit(out, "response.content_part.added",
         {{"item_id", item_id_},
          {"output_index", OutputIndex()},
          {"content_index", 0},
          {"part", std::move(part)}});
  }

  void Close(std::string& out) {
    const json::object base{{"item_id", item_id_}, {"output_index", OutputIndex()}};
    json::object item;
    switch (open_) {
      case ItemKind::kNone:
        return;
      case ItemKind::kMessage:
      case ItemKind::kReasoning: {
        const bool message = open_ == ItemKind::kMessage;
        json::object done = base;
        done["content_index"] = 0;
        done["text"] = text_;
        if (message) done["logprobs"] = logprobs_;
        Emit(out, message ? "response.output_text.done" : "response.reasoning_text.done", done);
        item = message ? MessageItem(item_id_, text_, true, std::move(logprobs_))
                       : ReasoningItem(item_id_, text_, true);
        logprobs_ = {};
        json::object part_done = base;
        part_done["content_index"] = 0;
        part_done["part"] = item.at("content").get_array().front();
        Emit(out, "response.content_part.done", std::move(part_done));
        break;
      }
      case ItemKind::kFunctionCall: {
        json::object done = base;
        done["name"] = call_name_;
        done["arguments"] = text_;
        Emit(out, "response.function_call_arguments.done", std::move(done));
        item = FunctionCallItem(item_id_, call_id_, call_name_, text_, true);
        break;
      }
    }
    Emit(out, "response.output_item.done", {{"output_index", OutputIndex()}, {"item", item}});
    output_.push_back(std::move(item));
    open_ = ItemKind::kNone;
  }

  json::object Object(std::string_view status, json::value usage) const {
    json::object o{
        {"id", meta_.id},
        {"object", "response"},
        {"created_at", meta_.created},
        {"status", status},
        {"background", false},
        {"error", nullptr},
        {"incomplete_details", nullptr},
        {"model", meta_.model},
        {"output", output_},
        {"parallel_tool_calls", true},
        {"previous_response_id", nullptr},
        {"store", false},
        {"truncation", "disabled"},
        {"text", echo_.contains("text")
                     ? echo_.at("text")
                     : json::value(json::object{{"format", json::object{{"type", "text"}}}})},
        {"usage", std::move(usage)},
        {"metadata", json::object{}}};
    for (const char* key : {"instructions", "max_output_tokens", "temperature", "top_p",
                            "top_logprobs", "tool_choice", "tools", "reasoning", "user"}) {
      const json::value* v = echo_.if_contains(key);
      o[key] = v != nullptr ? *v : json::value(nullptr);
    }
    if (o["tools"].is_null()) o["tools"] = json::array{};
    if (o["tool_choice"].is_null()) o["tool_choice"] = "auto";
    if (status == "incomplete") {
      o["incomplete_details"] = json::object{{"reason", "max_output_tokens"}};
    }
    return o;
  }

  ResponseMeta meta_;
  json::object echo_;
  json::array output_;  // finished items
  ItemKind open_ = ItemKind::kNone;
  std::string item_id_, call_id_, call_name_, text_;
  json::array logprobs_;  // of the open message item
  Finish finish_ = Finish::kNone;
  int64_t sequence_ = 0;
  bool failed_ = false;
};

}  // namespace

ApiResult<GenerationRequest> ParseResponsesRequest(const json::object& body) {
  GenerationRequest req;
  req.api = Api::kResponses;
  req.chat = true;
  req.include_usage = true;
  FieldReader r(body);
  if (auto model = r.String("model")) req.model = *model;
  if (auto instructions = r.String("instructions")) {
    req.messages.push_back(json::object{{"role", "system"}, {"content", *instructions}});
  }
  const json::value* input = r.Get("input");
  if (input == nullptr) {
    r.Fail("input", "'input' is required");
  } else if (input->is_string()) {
    req.messages.push_back(json::object{{"role", "user"}, {"content", input->get_string()}});
  } else if (input->is_array()) {
    ReadInputItems(r, input->get_array(), req.messages);
  } else {
    r.Fail("input",
           fmt::format("'input' must be a string or an array of items, got {}", TypeName(*input)));
  }
  if (r.ok() && req.messages.empty()) r.Fail("input", "'input' must not be empty");
  ReadSamplingFields(r, req);
  ReadTools(r, body, req);
  req.max_tokens = r.Int("max_output_tokens", 1, INT32_MAX);
  req.stream = r.Bool("stream").value_or(false);
  if (auto top = r.Int("top_logprobs", 0, 20)) {
    req.logprobs = true;
    req.top_logprobs = static_cast<int>(*top);
  }
  if (const json::object* reasoning = r.Object("reasoning")) {
    FieldReader rr(*reasoning, "reasoning.");
    if (auto effort = rr.String("effort")) req.template_kwargs["reasoning_effort"] = *effort;
    if (!rr.ok()) r.Fail(rr.error().param, rr.error().message);
  }
  // text.format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "name",
  // "schema", "strict"}.
  if (const json::object* text = r.Object("text")) {
    FieldReader tr(*text, "text.");
    if (const json::object* format = tr.Object("format")) {
      const json::value* type = format->if_contains("type");
      const std::string_view t =
          type != nullptr && type->is_string() ? std::string_view(type->get_string()) : "";
      if (t == "json_object") {
        ReadJsonObjectFormat(r, "text.format", req);
      } else if (t == "json_schema") {
        ReadJsonSchemaFormat(r, "text.format", *format, req);
      } else if (t != "text") {
        tr.Fail("format", "'text.format.type' must be text, json_object or json_schema");
      }
    }
    if (!tr.ok()) r.Fail(tr.error().param, tr.error().message);
  }
  if (r.Get("previous_response_id") != nullptr) {
    r.Fail("previous_response_id",
           "'previous_response_id' is not supported: this server stores no responses; send the "
           "whole conversation in 'input'");
  }
  if (r.Bool("background").value_or(false)) {
    r.Fail("background", "'background' responses are not supported");
  }
  if (!r.ok()) return r.error();
  for (const char* key : {"instructions", "max_output_tokens", "temperature", "top_p",
                          "top_logprobs", "tool_choice", "tools", "reasoning", "user", "text"}) {
    if (const json::value* v = r.Get(key)) req.echo_fields[key] = *v;
  }
  return req;
}

std::unique_ptr<ResponseEncoder> MakeResponsesEncoder(const GenerationRequest& req,
                                                      ResponseMeta meta) {
  return std::make_unique<ResponsesEncoder>(req, std::move(meta));
}

}  // namespace dinfer::server
