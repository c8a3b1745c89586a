// libFuzzer target: any bytes as the body of every endpoint's request. Parsing must return a
// request or an error naming the problem — never crash, hang or read out of bounds — and every
// parsed request must encode a response, streamed and not.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/protocol/anthropic.h"
#include "server/protocol/fields.h"
#include "server/protocol/openai.h"
#include "server/protocol/output_pipeline.h"
#include "server/protocol/responses.h"

namespace {

using namespace dinfer::server;

void Exercise(ApiResult<GenerationRequest> parsed, std::string_view text) {
  if (!parsed.ok()) {
    if (parsed.error().message.empty()) __builtin_trap();
    return;
  }
  GenerationRequest& req = *parsed;
  auto encoder = MakeEncoder(req, ResponseMeta{"id", 0, "m"});
  const int choices = req.sampling.n * std::max<int>(1, static_cast<int>(req.prompts.size()));
  std::string out;
  encoder->StreamStart(Usage{}, out);
  std::vector<ChoiceResult> results;
  for (int i = 0; i < choices && i < 4; ++i) {
    // Every output format at once, so that the request's text drives all the parsers.
    dinfer::output::OutputFormat format;
    format.reasoning = dinfer::output::ReasoningFormat::kThink;
    format.tools = dinfer::output::ToolCallFormat::kHermes;
    format.stop = req.stop;
    ChoiceOutput choice(i, req, format, [](int32_t t) { return std::to_string(t); });
    dinfer::RequestOutput o;
    o.text = std::string(text.substr(0, 64));
    o.token_ids = {1};
    o.logprobs = {dinfer::TokenLogprob{1, -1.0f, {{1, -1.0f}}}};
    o.finished = true;
    o.finish_reason = "length";
    encoder->StreamUpdate(choice.Process(o), out);
    results.push_back(choice.result());
  }
  encoder->StreamEnd(Usage{}, out);
  MakeEncoder(req, ResponseMeta{"id", 0, "m"})->Body(results, Usage{});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  auto object = ParseBody(body);
  if (!object.ok()) return 0;
  Exercise(ParseChatCompletion(*object), body);
  Exercise(ParseCompletion(*object), body);
  Exercise(ParseResponsesRequest(*object), body);
  Exercise(ParseMessages(*object), body);
  Exercise(ParseCountTokens(*object), body);
  return 0;
}
