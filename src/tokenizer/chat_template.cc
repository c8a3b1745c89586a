#include "tokenizer/chat_template.h"

#include <algorithm>
#include <ctime>

#include "tokenizer/jinja/template.h"

namespace dinfer::tokenizer {

using jinja::Args;
using jinja::TemplateError;
using jinja::Value;

StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  try {
    std::shared_ptr<const jinja::Template> t = jinja::Template::Parse(source);
    const ContentFormat format =
        t->LoopsOver("content") ? ContentFormat::kParts : ContentFormat::kString;
    return ChatTemplate(std::move(t), format);
  } catch (const TemplateError& e) {
    return InvalidArgument("chat template syntax error at line {}: {}", e.line, e.message);
  }
}

namespace {

// HF's strftime_now: datetime.now().strftime(format), in local time.
Value StrftimeNow(std::chrono::system_clock::time_point now) {
  return Value::Callable("strftime_now", [now](const Args& args) {
    if (args.positional.size() != 1 || !args.positional[0].is_string()) {
      jinja::Fail("strftime_now expects one format string");
    }
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    std::tm local{};
    localtime_r(&t, &local);
    const std::string& format = args.positional[0].text().str();
    std::string out(format.size() * 4 + 64, '\0');
    const size_t n =
        format.empty() ? 0 : std::strftime(out.data(), out.size(), format.c_str(), &local);
    out.resize(n);
    // The date is computed, not supplied by the request: the template's own text.
    return Value::String(std::move(out), /*trusted=*/true);
  });
}

Value RaiseException() {
  return Value::Callable("raise_exception", [](const Args& args) -> Value {
    const Value message = args.positional.empty() ? Value::None() : args.positional[0];
    throw TemplateError{jinja::ToText(message).str()};
  });
}

// transformers marks the end of the message to continue with this, then cuts the prompt there.
constexpr std::string_view kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";

// The final message with the tag after its text (its last text part, for content parts); the
// text before the tag in *final_text.
StatusOr<Value> TagFinalMessage(const boost::json::value& message, std::string* final_text) {
  boost::json::value tagged = message;
  boost::json::value* content =
      tagged.is_object() ? tagged.as_object().if_contains("content") : nullptr;
  if (content == nullptr || content->is_null()) {
    return InvalidArgument(
        "continue_final_message is set but the final message has no content to continue");
  }
  boost::json::string* text = content->is_string() ? &content->as_string() : nullptr;
  if (content->is_array()) {
    for (auto it = content->as_array().rbegin(); it != content->as_array().rend() && !text; ++it) {
      if (!it->is_object()) continue;
      if (boost::json::value* t = it->as_object().if_contains("text"); t && t->is_string()) {
        text = &t->as_string();
      }
    }
  }
  if (text == nullptr) {
    return InvalidArgument(
        "continue_final_message is set but the final message has no text to continue");
  }
  *final_text = std::string(*text);
  text->append(kContinueTag);
  return Value::FromJson(tagged);
}

// Cuts the render at the tag, as transformers does: before it, or, when the template trimmed the
// space after it, before it and the whitespace before it.
StatusOr<jinja::Text> CutAtTag(const jinja::Text& text, std::string_view final_text) {
  const std::string& s = text.str();
  size_t begin = 0, end = 0;
  jinja::StripRange(final_text, {}, true, true, &begin, &end);
  const std::string_view bare_tag = kContinueTag.substr(0, kContinueTag.size() - 1);
  if (s.find(final_text.substr(begin, end - begin)) == std::string::npos ||
      s.find(bare_tag) == std::string::npos) {
    return InvalidArgument(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template");
  }
  const size_t tag = s.rfind(bare_tag);
  if (s.compare(tag, kContinueTag.size(), kContinueTag) == 0) return text.Slice(0, tag);
  jinja::StripRange(std::string_view(s).substr(0, tag), {}, false, true, &begin, &end);
  return text.Slice(0, end);
}

}  // namespace

StatusOr<std::vector<PromptSegment>> ChatTemplate::Render(const boost::json::array& messages,
                                                          const ChatRenderOptions& options) const {
  if (options.continue_final_message && options.add_generation_prompt) {
    return InvalidArgument(
        "continue_final_message and add_generation_prompt are not compatible: the first continues "
        "the final message, the second starts a new assistant message");
  }
  if (!options.documents.is_null()) {
    const bool list_of_objects =
        options.documents.is_array() &&
        std::all_of(options.documents.as_array().begin(), options.documents.as_array().end(),
                    [](const boost::json::value& d) { return d.is_object(); });
    if (!list_of_objects) return InvalidArgument("documents must be a list of objects");
  }
  std::vector<std::pair<std::string, Value>> globals;
  // What HF's apply_chat_template passes: the tokenizer's special tokens, then the template
  // kwargs (which may override them), then messages, tools, documents, add_generation_prompt.
  if (!options.bos_token.empty()) {
    globals.emplace_back("bos_token", Value::String(options.bos_token, /*trusted=*/true));
  }
  if (!options.eos_token.empty()) {
    globals.emplace_back("eos_token", Value::String(options.eos_token, /*trusted=*/true));
  }
  for (const auto& [key, value] : options.kwargs) {
    if (key == "messages" || key == "tools" || key == "documents" ||
        key == "add_generation_prompt") {
      return InvalidArgument("chat_template_kwargs may not set '{}'", std::string_view(key));
    }
    globals.emplace_back(std::string(key), Value::FromJson(value));
  }
  std::vector<Value> chat;
  chat.reserve(messages.size());
  std::string final_text;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (options.continue_final_message && i + 1 == messages.size()) {
      DINFER_ASSIGN_OR_RETURN(Value tagged, TagFinalMessage(messages[i], &final_text));
      chat.push_back(std::move(tagged));
    } else {
      chat.push_back(Value::FromJson(messages[i]));
    }
  }
  if (options.continue_final_message && messages.empty()) {
    return InvalidArgument("continue_final_message is set but there is no message");
  }
  globals.emplace_back("messages", Value::List(std::move(chat)));
  globals.emplace_back("tools",
                       options.tools.is_null() ? Value::None() : Value::FromJson(options.tools));
  globals.emplace_back("documents", options.documents.is_null()
                                        ? Value::None()
                                        : Value::FromJson(options.documents));
  globals.emplace_back("add_generation_prompt", Value::Bool(options.add_generation_prompt));
  globals.emplace_back("raise_exception", RaiseException());
  globals.emplace_back("strftime_now",
                       StrftimeNow(options.now.value_or(std::chrono::system_clock::now())));

  jinja::Text text;
  try {
    text = template_->Render(globals);
  } catch (const TemplateError& e) {
    return InvalidArgument("chat template error at line {}: {}", e.line, e.message);
  }
  if (options.continue_final_message) {
    DINFER_ASSIGN_OR_RETURN(text, CutAtTag(text, final_text));
  }
  std::vector<PromptSegment> segments;
  segments.reserve(text.runs().size());
  size_t begin = 0;
  for (const jinja::Text::Run& run : text.runs()) {
    segments.push_back({text.str().substr(begin, run.end - begin), run.trusted});
    begin = run.end;
  }
  return segments;
}

Status ParseToolCallArguments(boost::json::array* messages) {
  for (size_t i = 0; i < messages->size(); ++i) {
    boost::json::object* m = (*messages)[i].if_object();
    boost::json::value* calls = m ? m->if_contains("tool_calls") : nullptr;
    if (calls == nullptr || !calls->is_array()) continue;
    for (boost::json::value& call : calls->as_array()) {
      boost::json::value* function =
          call.is_object() ? call.as_object().if_contains("function") : nullptr;
      if (function == nullptr || !function->is_object()) continue;
      boost::json::value& args = function->as_object()["arguments"];
      if (args.is_object() || args.is_array()) continue;
      if (args.is_null() || (args.is_string() && args.as_string().empty())) {
        args = boost::json::object();
        continue;
      }
      boost::json::error_code ec;
      boost::json::value parsed =
          args.is_string() ? boost::json::parse(args.as_string(), ec) : boost::json::value();
      if (!args.is_string() || ec) {
        return InvalidArgument("messages[{}]: tool call arguments are not valid JSON", i);
      }
      args = std::move(parsed);
    }
  }
  return OkStatus();
}

Status FlattenTextContent(boost::json::array* messages) {
  for (size_t i = 0; i < messages->size(); ++i) {
    boost::json::object* m = (*messages)[i].if_object();
    boost::json::value* content = m ? m->if_contains("content") : nullptr;
    if (content == nullptr || !content->is_array()) continue;
    std::string text;
    bool first = true;
    for (const boost::json::value& part : content->as_array()) {
      const boost::json::object* p = part.if_object();
      const boost::json::value* type = p ? p->if_contains("type") : nullptr;
      const boost::json::value* t = p ? p->if_contains("text") : nullptr;
      if (type == nullptr || !type->is_string() || type->as_string() != "text" || t == nullptr ||
          !t->is_string()) {
        return InvalidArgument("messages[{}]: only text content parts are supported", i);
      }
      if (!first) text += '\n';
      text += t->as_string();
      first = false;
    }
    *content = boost::json::string(text);
  }
  return OkStatus();
}

std::string ChatTemplate::Join(const std::vector<PromptSegment>& segments) {
  std::string out;
  for (const PromptSegment& s : segments) out += s.text;
  return out;
}

}  // namespace dinfer::tokenizer
