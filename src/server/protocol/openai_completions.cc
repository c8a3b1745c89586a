// /v1/completions: request parsing (prompts as text, token ids or lists of either) and the
// text_completion shape, streamed or not.
#include <map>

#include <fmt/format.h>

#include <boost/json/serialize.hpp>

#include "server/protocol/fields.h"
#include "server/protocol/openai.h"

namespace dinfer::server {

namespace json = boost::json;

namespace {

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxPrompts = 64;

std::optional<std::vector<int32_t>> TokenIds(const json::array& a) {
  std::vector<int32_t> ids;
  for (const json::value& v : a) {
    if (!v.is_int64() || v.get_int64() < 0 || v.get_int64() > INT32_MAX) return std::nullopt;
    ids.push_back(static_cast<int32_t>(v.get_int64()));
  }
  return ids;
}

// "prompt": "text" | ["text", ...] | [id, ...] | [[id, ...], ...].
void ReadPrompts(FieldReader& r, GenerationRequest& req) {
  const json::value* p = r.Get("prompt");
  if (p == nullptr) {
    r.Fail("prompt", "'prompt' is required");
    return;
  }
  auto bad = [&] {
    r.Fail("prompt",
           "'prompt' must be a string, an array of strings, an array of token ids or an array of "
           "arrays of token ids");
  };
  if (p->is_string()) {
    req.prompts.push_back({std::string(p->get_string()), {}});
  } else if (!p->is_array() || p->get_array().empty()) {
    return bad();
  } else if (p->get_array()[0].is_number()) {
    auto ids = TokenIds(p->get_array());
    if (!ids) return bad();
    req.prompts.push_back({"", std::move(*ids)});
  } else {
    for (const json::value& item : p->get_array()) {
      if (item.is_string()) {
        req.prompts.push_back({std::string(item.get_string()), {}});
      } else if (item.is_array() && !item.get_array().empty()) {
        auto ids = TokenIds(item.get_array());
        if (!ids) return bad();
        req.prompts.push_back({"", std::move(*ids)});
      } else {
        return bad();
      }
    }
  }
  if (req.prompts.size() > kMaxPrompts) {
    r.Fail("prompt", fmt::format("at most {} prompts per request", kMaxPrompts));
  }
  for (const PromptInput& in : req.prompts) {
    if (in.text.empty() && in.ids.empty()) r.Fail("prompt", "'prompt' must not be empty");
  }
}

class CompletionEncoder final : public ResponseEncoder {
 public:
  CompletionEncoder(const GenerationRequest& req, ResponseMeta meta)
      : meta_(std::move(meta)),
        n_(req.sampling.n),
        include_usage_(req.include_usage),
        logprobs_(req.logprobs),
        echo_(req.echo) {
    for (const PromptInput& p : req.prompts) prompt_texts_.push_back(p.text);
  }

  void StreamStart(const Usage&, std::string& out) override {
    if (!echo_) return;
    for (size_t p = 0; p < prompt_texts_.size(); ++p) {
      for (int j = 0; j < n_; ++j) {
        const int index = static_cast<int>(p) * n_ + j;
        offsets_[index] = static_cast<int64_t>(prompt_texts_[p].size());
        Chunk(out, index, prompt_texts_[p], nullptr, nullptr);
      }
    }
  }

  void StreamUpdate(const ChoiceUpdate& u, std::string& out) override {
    std::string text;
    for (const OutputEvent& e : u.events) {
      if (e.type == OutputEvent::Type::kText) text += e.text;
    }
    json::value logprobs = nullptr;
    if (logprobs_ && !u.logprobs.empty()) logprobs = Logprobs(u.index, u.logprobs);
    if (!text.empty() || !logprobs.is_null()) {
      Chunk(out, u.index, text, std::move(logprobs), nullptr);
    }
    if (u.finish == Finish::kError) {
      StreamError(ApiError{ErrorKind::kInternal, u.error, "", ""}, out);
    } else if (u.finish != Finish::kNone) {
      Chunk(out, u.index, "", nullptr, OpenAiFinishReason(u.finish));
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
    out += "data: " + ErrorBody(Api::kCompletions, error) + "\n\n";
  }

  std::string Body(const std::vector<ChoiceResult>& results, const Usage& usage) override {
    json::array choices;
    for (const ChoiceResult& c : results) {
      std::string text = c.text;
      if (echo_) {
        const std::string& prompt = prompt_texts_[static_cast<size_t>(c.index / n_)];
        offsets_[c.index] = static_cast<int64_t>(prompt.size());
        text = prompt + text;
      }
      choices.push_back(
          json::object{{"index", c.index},
                       {"text", std::move(text)},
                       {"logprobs", logprobs_ ? Logprobs(c.index, c.logprobs) : json::value()},
                       {"finish_reason", OpenAiFinishReason(c.finish)}});
    }
    json::object body = Head();
    body["choices"] = std::move(choices);
    body["usage"] = OpenAiUsage(usage);
    return json::serialize(body);
  }

 private:
  json::object Head() const {
    return {{"id", meta_.id},
            {"object", "text_completion"},
            {"created", meta_.created},
            {"model", meta_.model}};
  }

  void Chunk(std::string& out, int index, std::string text, json::value logprobs,
             json::value finish_reason) {
    json::object chunk = Head();
    chunk["choices"] = json::array{json::object{{"index", index},
                                                {"text", std::move(text)},
                                                {"logprobs", std::move(logprobs)},
                                                {"finish_reason", std::move(finish_reason)}}};
    AppendEvent(out, "", chunk);
  }

  // The legacy logprobs shape; text_offset counts bytes from the start of the choice's text.
  json::value Logprobs(int index, const std::vector<LogprobEntry>& entries) {
    json::array tokens, token_logprobs, top_logprobs, text_offset;
    int64_t& offset = offsets_[index];
    for (const LogprobEntry& e : entries) {
      tokens.push_back(json::value(e.token));
      token_logprobs.push_back(e.logprob);
      json::object top;
      for (const auto& [token, lp] : e.top) top[token] = lp;
      top_logprobs.push_back(std::move(top));
      text_offset.push_back(offset);
      offset += static_cast<int64_t>(e.token.size());
    }
    return json::object{{"tokens", std::move(tokens)},
                        {"token_logprobs", std::move(token_logprobs)},
                        {"top_logprobs", std::move(top_logprobs)},
                        {"text_offset", std::move(text_offset)}};
  }

  ResponseMeta meta_;
  int n_;
  bool include_usage_, logprobs_, echo_;
  std::vector<std::string> prompt_texts_;
  std::map<int, int64_t> offsets_;
};

}  // namespace

ApiResult<GenerationRequest> ParseCompletion(const json::object& body) {
  GenerationRequest req;
  req.api = Api::kCompletions;
  FieldReader r(body);
  if (auto model = r.String("model")) req.model = *model;
  ReadPrompts(r, req);
  ReadSamplingFields(r, req);
  ReadStopStrings(r, "stop", kMaxStopStrings, req.stop);
  req.max_tokens = r.Int("max_tokens", 1, INT32_MAX);
  if (auto n = r.Int("n", 1, 128)) req.sampling.n = static_cast<int>(*n);
  if (auto best_of = r.Int("best_of", 1, 128); best_of && *best_of != req.sampling.n) {
    r.Fail("best_of", "'best_of' other than 'n' is not supported");
  }
  req.stream = r.Bool("stream").value_or(false);
  if (const json::object* so = r.Object("stream_options")) {
    if (!req.stream) r.Fail("stream_options", "'stream_options' is only allowed with stream");
    FieldReader sr(*so, "stream_options.");
    req.include_usage = sr.Bool("include_usage").value_or(false);
    if (!sr.ok()) r.Fail(sr.error().param, sr.error().message);
  }
  if (auto lp = r.Int("logprobs", 0, 20)) {
    req.logprobs = true;
    req.top_logprobs = static_cast<int>(*lp);
  }
  req.echo = r.Bool("echo").value_or(false);
  if (req.echo && req.logprobs) {
    r.Fail("echo", "'echo' with 'logprobs' is not supported: prompt logprobs are not computed");
  }
  if (auto suffix = r.String("suffix"); suffix && !suffix->empty()) {
    r.Fail("suffix", "'suffix' (fill-in-the-middle) is not supported");
  }
  if (!r.ok()) return r.error();
  return req;
}

std::unique_ptr<ResponseEncoder> MakeCompletionEncoder(const GenerationRequest& req,
                                                       ResponseMeta meta) {
  return std::make_unique<CompletionEncoder>(req, std::move(meta));
}

}  // namespace dinfer::server
