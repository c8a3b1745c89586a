#include "tokenizer/deepseek_v4_encoding.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <unordered_map>

#include "tokenizer/python_json.h"

namespace dinfer::tokenizer {
namespace {

namespace json = boost::json;
using Tok = DeepSeekV4Tokens;

// The encoding's own prose. The special tokens inside it are written as tokens (see
// SegmentWriter::Prose); the rest is plain text.
constexpr std::string_view kEffortHigh =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";
constexpr std::string_view kEffortMax =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
    "exhaustively decompose the problem into its most fundamental components, trace every causal "
    "chain to its root, and resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple "
    "angles and are certain that no assumption remains unchecked and no error remains "
    "undiscovered.\n\n";
constexpr std::string_view kToolsIntro =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    "by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
constexpr std::string_view kToolsOutro =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n";
constexpr std::string_view kJsonObjectFormat =
    "You are a helpful assistant designed to output JSON.\n## Response Format:\n\n"
    "Reply with JSON object ONLY.";
constexpr std::string_view kJsonSchemaFormat =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// Builds the segments: tokens trusted, all other text untrusted, adjacent pieces merged.
class SegmentWriter {
 public:
  void Token(std::string_view token) { Append(token, true); }
  void Text(std::string_view text) { Append(text, false); }
  // Text the encoding itself wrote: the special-token spellings in it become tokens.
  void Prose(std::string_view text) {
    static constexpr std::array<std::string_view, 3> kInProse = {Tok::kDsml, Tok::kThinkStart,
                                                                 Tok::kThinkEnd};
    while (!text.empty()) {
      size_t first = text.size();
      std::string_view token;
      for (std::string_view t : kInProse) {
        size_t at = text.find(t);
        if (at < first) first = at, token = t;
      }
      Text(text.substr(0, first));
      if (token.empty()) return;
      Token(token);
      text.remove_prefix(first + token.size());
    }
  }
  std::vector<PromptSegment> Take() { return std::move(segments_); }

 private:
  void Append(std::string_view text, bool trusted) {
    if (text.empty()) return;
    // Tokens stay one segment each, so that each maps to one special token.
    if (!trusted && !segments_.empty() && !segments_.back().trusted) {
      segments_.back().text += text;
    } else {
      segments_.push_back({std::string(text), trusted});
    }
  }
  std::vector<PromptSegment> segments_;
};

// A message reduced to what the encoding renders.
struct ToolCallIn {
  std::string id, name;
  json::value arguments;  // an object, or the raw string when it is not one
};
struct Block {  // a piece of a user turn
  bool tool_result = false;
  std::string text;
  std::string tool_call_id;
};
struct Turn {
  enum class Kind { kUser, kAssistant, kReminder };
  Kind kind = Kind::kUser;
  std::vector<Block> blocks;  // kUser
  std::string content;        // kAssistant, kReminder
  std::string reasoning;      // kAssistant
  std::vector<ToolCallIn> tool_calls;
  bool prefix = false;  // an assistant message to continue
};

StatusOr<std::string> ContentText(const json::object& message, size_t index) {
  const json::value* content = message.if_contains("content");
  if (!content || content->is_null()) return std::string();
  if (content->is_string()) return std::string(content->get_string());
  if (!content->is_array()) {
    return InvalidArgument("messages[{}].content must be a string, null or a list of parts", index);
  }
  // Text parts join with a blank line, as DeepSeek's encoding joins the blocks of a turn.
  std::string text;
  bool first = true;
  for (const json::value& part : content->get_array()) {
    const json::object* p = part.if_object();
    const json::value* type = p ? p->if_contains("type") : nullptr;
    const json::value* t = p ? p->if_contains("text") : nullptr;
    if (!type || !type->is_string() || type->get_string() != "text" || !t || !t->is_string()) {
      return InvalidArgument("messages[{}].content: the DeepSeek V4 encoding takes text parts only",
                             index);
    }
    if (!first) text += "\n\n";
    text += t->get_string();
    first = false;
  }
  return text;
}

std::string StringField(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

StatusOr<std::vector<ToolCallIn>> ReadToolCalls(const json::value& calls, size_t index) {
  std::vector<ToolCallIn> out;
  if (calls.is_null()) return out;
  if (!calls.is_array()) return InvalidArgument("messages[{}].tool_calls must be a list", index);
  for (const json::value& call : calls.get_array()) {
    const json::object* c = call.if_object();
    const json::value* fn = c ? c->if_contains("function") : nullptr;
    if (!fn || !fn->is_object() || !fn->get_object().contains("name")) {
      return InvalidArgument("messages[{}].tool_calls: each needs function.name", index);
    }
    ToolCallIn in;
    in.id = StringField(*c, "id");
    in.name = StringField(fn->get_object(), "name");
    const json::value* args = fn->get_object().if_contains("arguments");
    if (!args || args->is_null()) {
      in.arguments = json::object();
    } else if (args->is_string()) {
      // A JSON object in a string (the OpenAI wire form); anything else is kept as the text
      // itself, which DeepSeek's encoding passes as one string parameter named "arguments".
      json::error_code ec;
      json::value parsed = json::parse(args->get_string(), ec);
      in.arguments = !ec && parsed.is_object() ? std::move(parsed) : *args;
    } else if (args->is_object()) {
      in.arguments = *args;
    } else {
      in.arguments = json::value(json::string(PythonJson(*args)));
    }
    out.push_back(std::move(in));
  }
  return out;
}

// Tool results follow the order of the calls they answer (the latest assistant's tool_calls);
// unknown ids sort first, as in DeepSeek's encoding.
void SortToolResults(Turn* turn, const std::vector<ToolCallIn>& calls) {
  std::unordered_map<std::string, size_t> order;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (!calls[i].id.empty()) order.emplace(calls[i].id, i);
  }
  auto rank = [&](const Block& b) {
    auto it = order.find(b.tool_call_id);
    return it == order.end() ? size_t{0} : it->second;
  };
  std::vector<Block> results;
  for (const Block& b : turn->blocks) {
    if (b.tool_result) results.push_back(b);
  }
  if (results.size() < 2 || order.empty()) return;
  std::stable_sort(results.begin(), results.end(),
                   [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
  size_t next = 0;
  for (Block& b : turn->blocks) {
    if (b.tool_result) b = results[next++];
  }
}

struct Conversation {
  std::vector<std::string> system;
  std::vector<Turn> turns;
};

StatusOr<Conversation> ReadMessages(const json::array& messages, bool continue_final) {
  Conversation conv;
  std::vector<ToolCallIn> last_calls;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json::object* m = messages[i].if_object();
    if (!m) return InvalidArgument("messages[{}] must be an object", i);
    const std::string role = StringField(*m, "role");
    DINFER_ASSIGN_OR_RETURN(std::string content, ContentText(*m, i));
    if (role == "system" || role == "developer") {
      // DeepSeek's encoding gathers every system message into the prompt's head.
      conv.system.push_back(std::move(content));
    } else if (role == "user" || role == "tool") {
      Block block{role == "tool", std::move(content), StringField(*m, "tool_call_id")};
      // Consecutive user messages and tool results form one user turn.
      if (conv.turns.empty() || conv.turns.back().kind != Turn::Kind::kUser) {
        conv.turns.push_back({});
      }
      conv.turns.back().blocks.push_back(std::move(block));
      SortToolResults(&conv.turns.back(), last_calls);
    } else if (role == "assistant") {
      Turn turn;
      turn.kind = Turn::Kind::kAssistant;
      turn.content = std::move(content);
      for (std::string_view key : {"reasoning_content", "reasoning"}) {
        if (const json::value* r = m->if_contains(key); r && r->is_string()) {
          turn.reasoning = r->get_string();
          break;
        }
      }
      if (const json::value* calls = m->if_contains("tool_calls")) {
        DINFER_ASSIGN_OR_RETURN(turn.tool_calls, ReadToolCalls(*calls, i));
        if (!turn.tool_calls.empty()) last_calls = turn.tool_calls;
      }
      const json::value* prefix = m->if_contains("prefix");
      turn.prefix = (prefix && prefix->is_bool() && prefix->get_bool()) ||
                    (continue_final && i + 1 == messages.size());
      if (turn.prefix && i + 1 != messages.size()) {
        return InvalidArgument("messages[{}]: only the last message can be a prefix", i);
      }
      if (turn.prefix && !turn.tool_calls.empty()) {
        return InvalidArgument("messages[{}]: a prefix message cannot have tool_calls", i);
      }
      conv.turns.push_back(std::move(turn));
    } else if (role == "latest_reminder") {
      Turn turn;
      turn.kind = Turn::Kind::kReminder;
      turn.content = std::move(content);
      conv.turns.push_back(std::move(turn));
    } else {
      return InvalidArgument("messages[{}]: unknown role '{}'", i, role);
    }
  }
  return conv;
}

// A tool as the model sees it: {"name", "description", "parameters"} in that order. With
// "strict", the parameters get OpenAI's strict-mode defaults (no additional properties, every
// property required), which is what a strict tool promises the model.
StatusOr<json::object> ToolSchema(const json::value& tool, size_t index) {
  const json::object* t = tool.if_object();
  const json::value* type = t ? t->if_contains("type") : nullptr;
  const json::value* fn = t ? t->if_contains("function") : nullptr;
  if (!type || !type->is_string() || type->get_string() != "function" || !fn || !fn->is_object()) {
    return InvalidArgument("tools[{}]: only function tools are supported", index);
  }
  const json::object& f = fn->get_object();
  const json::value* name = f.if_contains("name");
  if (!name || !name->is_string() || name->get_string().empty()) {
    return InvalidArgument("tools[{}].function.name must be a non-empty string", index);
  }
  json::object schema;
  schema["name"] = *name;
  schema["description"] = StringField(f, "description");
  const json::value* params = f.if_contains("parameters");
  json::value parameters = params && params->is_object() ? *params : json::value(json::object());
  const json::value* strict = f.if_contains("strict");
  if (strict && strict->is_bool() && strict->get_bool()) {
    json::object& p = parameters.get_object();
    if (p.empty()) {
      p["type"] = "object";
      p["properties"] = json::object();
    }
    if (!p.contains("additionalProperties")) p["additionalProperties"] = false;
    if (!p.contains("required")) {
      json::array required;
      if (const json::value* props = p.if_contains("properties"); props && props->is_object()) {
        for (const auto& kv : props->get_object()) required.emplace_back(kv.key());
      }
      p["required"] = std::move(required);
    }
  }
  schema["parameters"] = std::move(parameters);
  return schema;
}

StatusOr<std::vector<json::object>> SelectTools(const DeepSeekV4Options& options) {
  std::vector<json::object> tools;
  if (options.tool_choice == DeepSeekV4Options::ToolChoice::kNone) return tools;
  for (size_t i = 0; i < options.tools.size(); ++i) {
    DINFER_ASSIGN_OR_RETURN(json::object schema, ToolSchema(options.tools[i], i));
    for (const json::object& seen : tools) {
      if (seen.at("name") == schema.at("name")) {
        return InvalidArgument("tools[{}]: tool names must be unique", i);
      }
    }
    tools.push_back(std::move(schema));
  }
  if (options.tool_choice == DeepSeekV4Options::ToolChoice::kNamed) {
    auto it = std::find_if(tools.begin(), tools.end(), [&](const json::object& t) {
      return t.at("name").get_string() == options.tool_choice_name;
    });
    if (it == tools.end()) {
      return InvalidArgument("tool_choice names '{}', which is not among the tools",
                             options.tool_choice_name);
    }
    tools = {*it};
  }
  return tools;
}

void WriteSystem(const Conversation& conv, const std::vector<json::object>& tools,
                 const json::value& response_format, SegmentWriter* w) {
  bool first = true;
  for (const std::string& s : conv.system) {
    if (!first) w->Text("\n\n");
    w->Text(s);
    first = false;
  }
  if (!tools.empty()) {
    w->Text("\n\n");
    w->Prose(kToolsIntro);
    for (size_t i = 0; i < tools.size(); ++i) {
      if (i > 0) w->Text("\n");
      w->Text(PythonJson(tools[i]));
    }
    w->Prose(kToolsOutro);
  }
  const json::object* format = response_format.if_object();
  const json::value* type = format ? format->if_contains("type") : nullptr;
  if (type && type->is_string() && type->get_string() == "json_object") {
    w->Text("\n\n");
    w->Text(kJsonObjectFormat);
  } else if (type && type->is_string() && type->get_string() == "json_schema") {
    const json::value* spec = format->if_contains("json_schema");
    const json::value* schema =
        spec && spec->is_object() ? spec->get_object().if_contains("schema") : nullptr;
    w->Text("\n\n");
    w->Text(kJsonSchemaFormat);
    w->Text(PythonJson(schema ? *schema : json::value(json::object())));
  }
}

void WriteToolCalls(const std::vector<ToolCallIn>& calls, SegmentWriter* w) {
  w->Text("\n\n<");
  w->Token(Tok::kDsml);
  w->Text("tool_calls>\n");
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i > 0) w->Text("\n");
    w->Text("<");
    w->Token(Tok::kDsml);
    w->Text("invoke name=\"");
    w->Text(calls[i].name);
    w->Text("\">\n");
    auto param = [&](std::string_view name, bool is_string, std::string_view value) {
      w->Text("<");
      w->Token(Tok::kDsml);
      w->Text("parameter name=\"");
      w->Text(name);
      w->Text(is_string ? "\" string=\"true\">" : "\" string=\"false\">");
      w->Text(value);
      w->Text("</");
      w->Token(Tok::kDsml);
      w->Text("parameter>\n");
    };
    if (calls[i].arguments.is_object()) {
      for (const auto& kv : calls[i].arguments.get_object()) {
        if (kv.value().is_string()) {
          param(kv.key(), true, kv.value().get_string());
        } else {
          param(kv.key(), false, PythonJson(kv.value()));
        }
      }
    } else {
      param("arguments", true, calls[i].arguments.get_string());
    }
    w->Text("</");
    w->Token(Tok::kDsml);
    w->Text("invoke>");
  }
  w->Text("\n</");
  w->Token(Tok::kDsml);
  w->Text("tool_calls>");
}

}  // namespace

Status ApplyDeepSeekV4ReasoningEffort(std::string_view effort, DeepSeekV4Options* options) {
  using E = DeepSeekV4Effort;
  static constexpr std::pair<std::string_view, E> kTiers[] = {
      {"minimal", E::kLow}, {"low", E::kLow},     {"medium", E::kHigh},
      {"high", E::kHigh},   {"xhigh", E::kXHigh}, {"max", E::kMax}};
  if (effort == "none") {
    options->thinking = false;
    return OkStatus();
  }
  for (const auto& [name, tier] : kTiers) {
    if (effort == name) {
      options->thinking = true;
      options->reasoning_effort = tier;
      return OkStatus();
    }
  }
  return InvalidArgument(
      "reasoning_effort '{}' is not one of none, minimal, low, medium, high, xhigh, max", effort);
}

StatusOr<DeepSeekV4Options> DeepSeekV4OptionsFromRequest(const json::object& request) {
  DeepSeekV4Options options;
  std::optional<bool> thinking;
  if (const json::value* t = request.if_contains("thinking"); t && !t->is_null()) {
    const json::value* type = t->is_object() ? t->get_object().if_contains("type") : nullptr;
    if (!type || !type->is_string() ||
        (type->get_string() != "enabled" && type->get_string() != "disabled")) {
      return InvalidArgument(
          "thinking must be {{\"type\": \"enabled\"}} or {{\"type\": \"disabled\"}}");
    }
    thinking = type->get_string() == "enabled";
  }
  if (const json::value* kw = request.if_contains("chat_template_kwargs"); kw && kw->is_object()) {
    for (std::string_view key : {"thinking", "enable_thinking"}) {
      const json::value* v = kw->get_object().if_contains(key);
      if (v && v->is_bool() && !thinking) thinking = v->get_bool();
    }
  }
  if (const json::value* e = request.if_contains("reasoning_effort");
      e && !e->is_null() && thinking != false) {
    if (!e->is_string()) return InvalidArgument("reasoning_effort must be a string");
    DINFER_RETURN_IF_ERROR(ApplyDeepSeekV4ReasoningEffort(e->get_string(), &options));
  }
  if (thinking) options.thinking = *thinking;
  if (const json::value* tools = request.if_contains("tools"); tools && !tools->is_null()) {
    if (!tools->is_array()) return InvalidArgument("tools must be a list");
    options.tools = tools->get_array();
  }
  if (const json::value* choice = request.if_contains("tool_choice");
      choice && !choice->is_null()) {
    using C = DeepSeekV4Options::ToolChoice;
    const json::value* fn =
        choice->is_object() ? choice->get_object().if_contains("function") : nullptr;
    const json::value* name =
        fn && fn->is_object() ? fn->get_object().if_contains("name") : nullptr;
    if (*choice == "auto") {
      options.tool_choice = C::kAuto;
    } else if (*choice == "none") {
      options.tool_choice = C::kNone;
    } else if (*choice == "required") {
      options.tool_choice = C::kRequired;
    } else if (name && name->is_string()) {
      options.tool_choice = C::kNamed;
      options.tool_choice_name = name->get_string();
    } else {
      return InvalidArgument(
          "tool_choice must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", "
          "\"function\": {{\"name\": ...}}}}");
    }
  }
  if (const json::value* format = request.if_contains("response_format")) {
    options.response_format = *format;
  }
  for (auto [key, field] : {std::pair{"add_generation_prompt", &options.add_generation_prompt},
                            std::pair{"continue_final_message", &options.continue_final_message}}) {
    if (const json::value* v = request.if_contains(key); v && !v->is_null()) {
      if (!v->is_bool()) return InvalidArgument("{} must be a boolean", key);
      *field = v->get_bool();
    }
  }
  return options;
}

StatusOr<std::vector<PromptSegment>> EncodeDeepSeekV4(const json::array& messages,
                                                      const DeepSeekV4Options& options) {
  using Choice = DeepSeekV4Options::ToolChoice;
  const bool forced_call =
      options.tool_choice == Choice::kRequired || options.tool_choice == Choice::kNamed;
  if (forced_call && options.thinking) {
    return InvalidArgument("tool_choice 'required' or a named tool needs thinking mode off");
  }
  if (messages.empty()) return InvalidArgument("messages must not be empty");
  DINFER_ASSIGN_OR_RETURN(Conversation conv,
                          ReadMessages(messages, options.continue_final_message));
  DINFER_ASSIGN_OR_RETURN(std::vector<json::object> tools, SelectTools(options));

  SegmentWriter w;
  w.Token(Tok::kBos);
  if (options.thinking && options.reasoning_effort != DeepSeekV4Effort::kLow) {
    w.Text(options.reasoning_effort == DeepSeekV4Effort::kMax ? kEffortMax : kEffortHigh);
  }
  WriteSystem(conv, tools, options.response_format, &w);

  // History reasoning is dropped, except in tool use (the model needs the reasoning behind its
  // earlier calls) and in the assistant message being continued.
  const bool keep_history_reasoning = options.thinking && !tools.empty();
  for (const Turn& turn : conv.turns) {
    switch (turn.kind) {
      case Turn::Kind::kUser: {
        w.Token(Tok::kUser);
        bool first = true;
        for (const Block& b : turn.blocks) {
          if (!first) w.Text("\n\n");
          w.Text(b.tool_result ? "<tool_result>" : "");
          w.Text(b.text);
          w.Text(b.tool_result ? "</tool_result>" : "");
          first = false;
        }
        break;
      }
      case Turn::Kind::kReminder:
        w.Token(Tok::kLatestReminder);
        w.Text(turn.content);
        break;
      case Turn::Kind::kAssistant:
        w.Token(Tok::kAssistant);
        if (turn.prefix) {
          if (options.thinking) {
            w.Token(Tok::kThinkStart);
            w.Text(turn.reasoning);
            if (!turn.content.empty()) w.Token(Tok::kThinkEnd);
          } else {
            w.Token(Tok::kThinkEnd);
          }
          w.Text(turn.content);
          break;
        }
        if (keep_history_reasoning) {
          w.Token(Tok::kThinkStart);
          w.Text(turn.reasoning);
        }
        w.Token(Tok::kThinkEnd);
        w.Text(turn.content);
        if (!turn.tool_calls.empty()) WriteToolCalls(turn.tool_calls, &w);
        w.Token(Tok::kEos);
        break;
    }
  }
  const bool continued = !conv.turns.empty() && conv.turns.back().prefix;
  if (options.add_generation_prompt && !continued) {
    w.Token(Tok::kAssistant);
    w.Token(options.thinking ? Tok::kThinkStart : Tok::kThinkEnd);
    if (forced_call) {
      w.Text("\n\n<");
      w.Token(Tok::kDsml);
      w.Text("tool_calls>\n");
    }
  }
  return w.Take();
}

}  // namespace dinfer::tokenizer
