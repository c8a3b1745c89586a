// Chat templates in the ChatML layout (<|im_start|>role\n...<|im_end|>\n), the format of
// SmolLM2, Qwen2 and many fine-tunes: the markers are trusted segments, message text is not.
#include "server/chat_prompt.h"

#include <string_view>

namespace dinfer::server {

namespace json = boost::json;

namespace {

class ChatMlRenderer final : public ChatPromptRenderer {
 public:
  StatusOr<std::vector<PromptSegment>> Render(const ChatRenderRequest& req) const override {
    if (!req.tools.empty()) {
      return Unimplemented(
          "tools need the model's own chat template, which this server cannot "
          "render yet");
    }
    std::vector<PromptSegment> out;
    for (const json::value& m : req.messages) {
      const json::object& msg = m.as_object();
      if (msg.contains("tool_calls")) {
        return Unimplemented(
            "assistant tool calls need the model's own chat template, which "
            "this server cannot render yet");
      }
      const json::value* content = msg.if_contains("content");
      out.push_back(
          {fmt::format("<|im_start|>{}\n", std::string_view(msg.at("role").as_string())), true});
      if (content != nullptr && content->is_string()) {
        out.push_back({std::string(content->get_string()), false});
      }
      out.push_back({"<|im_end|>\n", true});
    }
    if (req.add_generation_prompt) out.push_back({"<|im_start|>assistant\n", true});
    return out;
  }
};

}  // namespace

StatusOr<std::unique_ptr<ChatPromptRenderer>> MakeChatPromptRenderer(const ModelInfo& model) {
  if (model.chat_template.find("<|im_start|>") != std::string::npos) {
    return std::unique_ptr<ChatPromptRenderer>(new ChatMlRenderer());
  }
  if (model.chat_template.empty()) {
    return Unimplemented("model '{}' has no chat template: use /v1/completions", model.path);
  }
  return Unimplemented(
      "the chat template of model '{}' is not in a layout this server renders yet (ChatML): use "
      "/v1/completions",
      model.path);
}

}  // namespace dinfer::server
