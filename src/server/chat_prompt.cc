#include "server/chat_prompt.h"

#include <optional>

#include <boost/json/parse.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/deepseek_v4_encoding.h"

namespace dinfer::server {

namespace json = boost::json;

namespace {

// A parsed template and its source.
struct Template {
  tokenizer::ChatTemplate parsed;
  std::string source;
};

class JinjaRenderer final : public ChatPromptRenderer {
 public:
  JinjaRenderer(Template chat, std::optional<Template> tool_use, const ModelInfo& model)
      : chat_(std::move(chat)),
        tool_use_(std::move(tool_use)),
        bos_(model.bos_token),
        eos_(model.eos_token) {}

  StatusOr<std::vector<PromptSegment>> Render(const ChatRenderRequest& req) const override {
    tokenizer::ChatRenderOptions o;
    o.add_generation_prompt = !req.continue_final_message;
    o.continue_final_message = req.continue_final_message;
    if (!req.tools.empty()) o.tools = req.tools;
    o.kwargs = req.kwargs;
    o.bos_token = bos_;
    o.eos_token = eos_;
    return For(!req.tools.empty()).parsed.Render(TemplateMessages(req.messages), o);
  }
  const std::string& chat_template(bool with_tools) const override {
    return For(with_tools).source;
  }
  bool deepseek_v4() const override { return false; }

 private:
  // Templates read tool-call arguments as objects (`arguments | tojson`, `arguments.items()`), as
  // HF servers pass them; arguments that are not a JSON object stay text.
  static json::array TemplateMessages(const json::array& messages) {
    json::array out = messages;
    for (json::value& m : out) {
      json::value* calls = m.as_object().if_contains("tool_calls");
      if (calls == nullptr || !calls->is_array()) continue;
      for (json::value& call : calls->as_array()) {
        json::value* fn = call.is_object() ? call.as_object().if_contains("function") : nullptr;
        json::value* args =
            fn != nullptr && fn->is_object() ? fn->as_object().if_contains("arguments") : nullptr;
        if (args == nullptr || !args->is_string()) continue;
        boost::system::error_code ec;
        json::value parsed = json::parse(args->as_string(), ec);
        if (!ec && parsed.is_object()) *args = std::move(parsed);
      }
    }
    return out;
  }

  const Template& For(bool with_tools) const {
    return with_tools && tool_use_ ? *tool_use_ : chat_;
  }

  Template chat_;
  std::optional<Template> tool_use_;
  std::string bos_, eos_;
};

class DeepSeekV4Renderer final : public ChatPromptRenderer {
 public:
  StatusOr<std::vector<PromptSegment>> Render(const ChatRenderRequest& req) const override {
    tokenizer::DeepSeekV4Options o;
    o.add_generation_prompt = !req.continue_final_message;
    o.continue_final_message = req.continue_final_message;
    for (const char* key : {"thinking", "enable_thinking"}) {
      if (const json::value* v = req.kwargs.if_contains(key); v != nullptr && v->is_bool()) {
        o.thinking = v->get_bool();
      }
    }
    if (const json::value* effort = req.kwargs.if_contains("reasoning_effort");
        effort != nullptr && effort->is_string()) {
      DINFER_RETURN_IF_ERROR(tokenizer::ApplyDeepSeekV4ReasoningEffort(effort->get_string(), &o));
    }
    o.tools = req.tools;
    using Choice = tokenizer::DeepSeekV4Options::ToolChoice;
    switch (req.tool_choice.mode) {
      case ToolChoice::Mode::kAuto:
        o.tool_choice = Choice::kAuto;
        break;
      case ToolChoice::Mode::kNone:
        o.tool_choice = Choice::kNone;
        break;
      case ToolChoice::Mode::kRequired:
        o.tool_choice = Choice::kRequired;
        break;
      case ToolChoice::Mode::kNamed:
        o.tool_choice = Choice::kNamed;
        o.tool_choice_name = req.tool_choice.name;
        break;
    }
    return tokenizer::EncodeDeepSeekV4(req.messages, o);
  }
  const std::string& chat_template(bool) const override {
    static const std::string kNone;
    return kNone;
  }
  bool deepseek_v4() const override { return true; }
};

}  // namespace

StatusOr<std::unique_ptr<ChatPromptRenderer>> MakeChatPromptRenderer(
    const ModelInfo& model, const std::string& template_source) {
  if (model.architecture.rfind("deepseek_v4", 0) == 0) {
    return std::unique_ptr<ChatPromptRenderer>(new DeepSeekV4Renderer());
  }
  auto parse = [](const std::string& source) -> StatusOr<Template> {
    auto parsed = tokenizer::ChatTemplate::Parse(source);
    if (!parsed.ok()) return parsed.status().WithContext("the chat template does not parse: ");
    return Template{std::move(parsed).value(), source};
  };
  const bool overridden = !template_source.empty();
  const std::string& source = overridden ? template_source : model.chat_template;
  if (source.empty()) {
    return Unimplemented(
        "model '{}' has no chat template: give one with --chat-template, or use /v1/completions",
        model.path);
  }
  DINFER_ASSIGN_OR_RETURN(Template chat, parse(source));
  std::optional<Template> tool_use;
  if (!overridden && !model.tool_use_chat_template.empty()) {
    DINFER_ASSIGN_OR_RETURN(tool_use, parse(model.tool_use_chat_template));
  }
  return std::unique_ptr<ChatPromptRenderer>(
      new JinjaRenderer(std::move(chat), std::move(tool_use), model));
}

}  // namespace dinfer::server
