// DeepSeek V4's prompt encoding, written natively: DeepSeek ships V4's chat format as code (the
// checkpoint's encoding/encoding_dsv4.py and, for serving, the deepseek-recipe package's
// DeepseekV4Encoding) rather than as a Jinja template. This follows deepseek-recipe 0.2.0; its
// renderings (text, special-token ranges, token ids) are the goldens in
// tests/data/tokenizer/deepseek_v4/. Where encoding_dsv4.py differs, recipe's serving behaviour
// is taken: effort tiers (low: no prefix; high and xhigh: the "Absolute maximum" prefix; max:
// "Beyond maximum"), system messages gathered at the top wherever they stand, <｜Assistant｜>
// opening every assistant turn, the reasoning of earlier turns dropped unless tools are in use,
// tool schemas as {"name", "description", "parameters"}. Not from either: "developer" messages
// are system messages (OpenAI's meaning); recipe rejects the role.
//
// Segments: the special tokens the encoding writes are trusted; everything else — messages,
// tool schemas, arguments, and the encoding's own prose between its tokens — is untrusted, so
// it is encoded as plain text, as recipe's prompt encoding does (never as an added token).
// Pure functions of their arguments; safe from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <boost/json.hpp>

#include "base/status.h"
#include "dinfer/prompt.h"

namespace dinfer::tokenizer {

// Thinking effort tiers (OpenAI's reasoning_effort, as DeepSeek maps it).
enum class DeepSeekV4Effort { kLow, kHigh, kXHigh, kMax };

struct DeepSeekV4Options {
  bool thinking = true;  // thinking mode (the answer follows <think>…</think>)
  DeepSeekV4Effort reasoning_effort = DeepSeekV4Effort::kHigh;  // thinking mode only
  // OpenAI function tools ([{"type": "function", "function": {"name", "description",
  // "parameters", "strict"}}]), rendered in a "## Tools" section after the system prompt.
  boost::json::array tools;
  enum class ToolChoice { kAuto, kNone, kRequired, kNamed };
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;  // kNamed
  // OpenAI response_format ({"type": "text" | "json_object" | "json_schema", ...}) or null.
  boost::json::value response_format;
  // Open the assistant's turn at the end (<｜Assistant｜> and <think> or </think>), unless the
  // last message is an assistant message to continue ("prefix": true, DeepSeek's API field).
  bool add_generation_prompt = true;
  bool continue_final_message = false;  // treat the last assistant message as "prefix": true
};

// OpenAI's reasoning_effort: "none" turns thinking off; "minimal"/"low" → kLow,
// "medium"/"high" → kHigh, "xhigh" → kXHigh, "max" → kMax (thinking on). Others: InvalidArgument.
Status ApplyDeepSeekV4ReasoningEffort(std::string_view effort, DeepSeekV4Options* options);

// The options a Chat Completions request body asks for, read as DeepSeek's API reads them:
// "thinking": {"type": "enabled" | "disabled"} (or chat_template_kwargs "thinking" /
// "enable_thinking"; thinking is on by default), "reasoning_effort" (ignored when thinking is
// disabled), "tools", "tool_choice", "response_format", and vLLM's "add_generation_prompt" and
// "continue_final_message". InvalidArgument for fields of the wrong shape.
StatusOr<DeepSeekV4Options> DeepSeekV4OptionsFromRequest(const boost::json::object& request);

// `messages`: OpenAI Chat Completions messages (roles system, developer (as system), user,
// assistant, tool, latest_reminder; content a string, null or text parts; assistant
// reasoning_content (or reasoning), tool_calls with function.arguments a parsed object or a
// JSON string, prefix; tool_call_id). InvalidArgument for what the format cannot express (an
// unknown role, non-text content parts, a prefix message that is not last, tool_choice required
// or named in thinking mode, an unknown named tool).
StatusOr<std::vector<PromptSegment>> EncodeDeepSeekV4(const boost::json::array& messages,
                                                      const DeepSeekV4Options& options);

// The spellings of the special tokens the encoding writes (each one token of V4's vocabulary).
struct DeepSeekV4Tokens {
  static constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
  static constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
  static constexpr std::string_view kUser = "<｜User｜>";
  static constexpr std::string_view kAssistant = "<｜Assistant｜>";
  static constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
  static constexpr std::string_view kThinkStart = "<think>";
  static constexpr std::string_view kThinkEnd = "</think>";
  static constexpr std::string_view kDsml = "｜DSML｜";
};

}  // namespace dinfer::tokenizer
