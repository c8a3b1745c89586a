#include "server/protocol/fields.h"

#include <charconv>
#include <cmath>

#include <fmt/format.h>
#include <boost/json/parse.hpp>

namespace dinfer::server {

namespace json = boost::json;

unsigned HttpStatus(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidRequest:
      return 400;
    case ErrorKind::kAuthentication:
      return 401;
    case ErrorKind::kNotFound:
      return 404;
    case ErrorKind::kRequestTooLarge:
      return 413;
    case ErrorKind::kUnsupportedMedia:
      return 415;
    case ErrorKind::kOverloaded:
      return 503;
    case ErrorKind::kRateLimited:
      return 429;
    case ErrorKind::kInternal:
      return 500;
  }
  return 500;
}

ApiError InvalidParam(std::string param, std::string message) {
  return ApiError{ErrorKind::kInvalidRequest, std::move(message), std::move(param), ""};
}

std::string_view TypeName(const json::value& v) {
  switch (v.kind()) {
    case json::kind::null:
      return "null";
    case json::kind::bool_:
      return "a boolean";
    case json::kind::int64:
    case json::kind::uint64:
      return "an integer";
    case json::kind::double_:
      return "a number";
    case json::kind::string:
      return "a string";
    case json::kind::array:
      return "an array";
    case json::kind::object:
      return "an object";
  }
  return "a value";
}

const json::value* FieldReader::Get(std::string_view key) const {
  const json::value* v = object_.if_contains(key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

bool FieldReader::Fail(std::string_view key, std::string message) {
  if (!error_) error_ = InvalidParam(Name(key), std::move(message));
  return false;
}

std::optional<double> FieldReader::Number(std::string_view key, double lo, double hi) {
  const json::value* v = Get(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) {
    Fail(key, fmt::format("'{}' must be a number, got {}", Name(key), TypeName(*v)));
    return std::nullopt;
  }
  const double x = v->to_number<double>();
  if (!(x >= lo && x <= hi)) {
    Fail(key, fmt::format("'{}' must be in [{}, {}], got {}", Name(key), lo, hi, x));
    return std::nullopt;
  }
  return x;
}

std::optional<int64_t> FieldReader::Int(std::string_view key, int64_t lo, int64_t hi) {
  const json::value* v = Get(key);
  if (v == nullptr) return std::nullopt;
  int64_t x = 0;
  if (v->is_int64()) {
    x = v->get_int64();
  } else if (v->is_uint64()) {
    x = v->get_uint64() > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX
                                                           : static_cast<int64_t>(v->get_uint64());
  } else if (v->is_double() && std::trunc(v->get_double()) == v->get_double() &&
             std::abs(v->get_double()) < 9e15) {
    x = static_cast<int64_t>(v->get_double());
  } else {
    Fail(key, fmt::format("'{}' must be an integer, got {}", Name(key), TypeName(*v)));
    return std::nullopt;
  }
  if (x < lo || x > hi) {
    Fail(key, fmt::format("'{}' must be in [{}, {}], got {}", Name(key), lo, hi, x));
    return std::nullopt;
  }
  return x;
}

std::optional<bool> FieldReader::Bool(std::string_view key) {
  const json::value* v = Get(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_bool()) {
    Fail(key, fmt::format("'{}' must be a boolean, got {}", Name(key), TypeName(*v)));
    return std::nullopt;
  }
  return v->get_bool();
}

std::optional<std::string> FieldReader::String(std::string_view key) {
  const json::value* v = Get(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) {
    Fail(key, fmt::format("'{}' must be a string, got {}", Name(key), TypeName(*v)));
    return std::nullopt;
  }
  return std::string(v->get_string());
}

const json::object* FieldReader::Object(std::string_view key) {
  const json::value* v = Get(key);
  if (v == nullptr) return nullptr;
  if (!v->is_object()) {
    Fail(key, fmt::format("'{}' must be an object, got {}", Name(key), TypeName(*v)));
    return nullptr;
  }
  return &v->get_object();
}

const json::array* FieldReader::Array(std::string_view key) {
  const json::value* v = Get(key);
  if (v == nullptr) return nullptr;
  if (!v->is_array()) {
    Fail(key, fmt::format("'{}' must be an array, got {}", Name(key), TypeName(*v)));
    return nullptr;
  }
  return &v->get_array();
}

void ReadStopStrings(FieldReader& r, std::string_view key, size_t max_count,
                     std::vector<std::string>& out) {
  const json::value* v = r.Get(key);
  if (v == nullptr) return;
  if (v->is_string()) {
    if (!v->get_string().empty()) out.emplace_back(v->get_string());
    return;
  }
  if (!v->is_array()) {
    r.Fail(key, fmt::format("'{}' must be a string or an array of strings, got {}", r.Name(key),
                            TypeName(*v)));
    return;
  }
  if (v->get_array().size() > max_count) {
    r.Fail(key, fmt::format("'{}' has {} entries; at most {} are allowed", r.Name(key),
                            v->get_array().size(), max_count));
    return;
  }
  for (const json::value& s : v->get_array()) {
    if (!s.is_string() || s.get_string().empty()) {
      r.Fail(key, fmt::format("'{}' must hold non-empty strings", r.Name(key)));
      return;
    }
    out.emplace_back(s.get_string());
  }
}

void ReadSamplingFields(FieldReader& r, GenerationRequest& req) {
  SamplingParams& s = req.sampling;
  req.temperature = r.Number("temperature", 0.0, 2.0);
  req.top_p = r.Number("top_p", 0.0, 1.0);
  if (req.top_p && *req.top_p <= 0.0) r.Fail("top_p", "'top_p' must be greater than 0");
  // -1 is the "off" value of some clients (vLLM's convention); the engine's is 0.
  if (auto k = r.Int("top_k", -1, 1 << 30)) req.top_k = static_cast<int>(std::max<int64_t>(0, *k));
  if (auto v = r.Number("min_p", 0.0, 1.0)) s.min_p = *v;
  if (auto v = r.Int("seed", INT64_MIN, INT64_MAX)) s.seed = static_cast<uint64_t>(*v);
  if (auto v = r.Number("presence_penalty", -2.0, 2.0)) s.presence_penalty = *v;
  if (auto v = r.Number("frequency_penalty", -2.0, 2.0)) s.frequency_penalty = *v;
  if (auto v = r.Number("repetition_penalty", 0.0, 1e6)) {
    if (*v <= 0.0) r.Fail("repetition_penalty", "'repetition_penalty' must be greater than 0");
    s.repetition_penalty = *v;
  }
  if (auto v = r.Int("min_tokens", 0, 1 << 30)) s.min_tokens = static_cast<int32_t>(*v);
  if (auto v = r.Bool("ignore_eos")) s.ignore_eos = *v;
  if (auto v = r.Bool("skip_special_tokens")) s.skip_special_tokens = *v;
  if (const json::object* bias = r.Object("logit_bias")) {
    for (const auto& [key, value] : *bias) {
      int32_t token = 0;
      const auto* end = key.data() + key.size();
      const auto res = std::from_chars(key.data(), end, token);
      if (res.ec != std::errc() || res.ptr != end || token < 0) {
        r.Fail("logit_bias",
               fmt::format("'logit_bias' keys must be token ids, got '{}'", std::string_view(key)));
        return;
      }
      if (!value.is_number() || value.to_number<double>() < -100.0 ||
          value.to_number<double>() > 100.0) {
        r.Fail("logit_bias", fmt::format("'logit_bias' values must be numbers in [-100, 100]"));
        return;
      }
      s.logit_bias.emplace_back(token, static_cast<float>(value.to_number<double>()));
    }
  }
  if (const json::array* ids = r.Array("stop_token_ids")) {
    for (const json::value& id : *ids) {
      if (!id.is_int64() || id.get_int64() < 0 || id.get_int64() > INT32_MAX) {
        r.Fail("stop_token_ids", "'stop_token_ids' must hold token ids");
        return;
      }
      s.stop_token_ids.push_back(static_cast<int32_t>(id.get_int64()));
    }
  }
  ReadStructuredOutputs(r, req);
}

ApiResult<json::object> ParseBody(std::string_view body) {
  boost::system::error_code ec;
  json::parse_options opt;
  opt.max_depth = 64;
  json::value v = json::parse(body, ec, {}, opt);
  if (ec) {
    return ApiError{ErrorKind::kInvalidRequest,
                    fmt::format("the request body is not valid JSON: {}", ec.message()), "", ""};
  }
  if (!v.is_object()) {
    return ApiError{ErrorKind::kInvalidRequest,
                    fmt::format("the request body must be a JSON object, got {}", TypeName(v)), "",
                    ""};
  }
  return std::move(v.get_object());
}

}  // namespace dinfer::server
