// Helpers shared by the config.json readers (config.cc, config_deepseek_v4.cc): typed lookups in a
// parsed JSON object that leave the output untouched when a key is absent or null. Pure functions.
#pragma once

#include <string>
#include <vector>

#include <boost/json.hpp>

#include "model/config.h"

namespace dinfer::config_json {

template <typename T>
bool GetNumber(const boost::json::object& o, std::string_view key, T* out) {
  const auto* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return false;
  if (v->is_int64())
    *out = static_cast<T>(v->as_int64());
  else if (v->is_uint64())
    *out = static_cast<T>(v->as_uint64());
  else if (v->is_double())
    *out = static_cast<T>(v->as_double());
  else if (v->is_bool())
    *out = static_cast<T>(v->as_bool());
  else
    return false;
  return true;
}

inline void ReadIdList(const boost::json::value* v, std::vector<int32_t>* out) {
  if (v == nullptr) return;
  if (v->is_int64()) out->push_back(static_cast<int32_t>(v->as_int64()));
  if (v->is_array()) {
    for (const auto& e : v->as_array()) {
      if (e.is_int64()) out->push_back(static_cast<int32_t>(e.as_int64()));
    }
  }
}

// Fills the DeepSeek-V4 fields of `c` (common ones and c->deepseek_v4) from a config.json in
// DeepSeek's published layout or in the one transformers saves.
Status ParseDeepseekV4(const boost::json::object& o, const std::string& path, ModelConfig* c);

}  // namespace dinfer::config_json
