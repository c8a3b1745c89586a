#include "tokenizer/chat_template.h"

#include <ctime>

#include "tokenizer/jinja/template.h"

namespace dinfer::tokenizer {

using jinja::Args;
using jinja::TemplateError;
using jinja::Value;

StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  try {
    return ChatTemplate(jinja::Template::Parse(source));
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

}  // namespace

StatusOr<std::vector<PromptSegment>> ChatTemplate::Render(const boost::json::array& messages,
                                                          const ChatRenderOptions& options) const {
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
  for (const boost::json::value& m : messages) chat.push_back(Value::FromJson(m));
  globals.emplace_back("messages", Value::List(std::move(chat)));
  globals.emplace_back("tools",
                       options.tools.is_null() ? Value::None() : Value::FromJson(options.tools));
  globals.emplace_back("documents", Value::None());
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
  std::vector<PromptSegment> segments;
  segments.reserve(text.runs().size());
  size_t begin = 0;
  for (const jinja::Text::Run& run : text.runs()) {
    segments.push_back({text.str().substr(begin, run.end - begin), run.trusted});
    begin = run.end;
  }
  return segments;
}

std::string ChatTemplate::Join(const std::vector<PromptSegment>& segments) {
  std::string out;
  for (const PromptSegment& s : segments) out += s.text;
  return out;
}

}  // namespace dinfer::tokenizer
