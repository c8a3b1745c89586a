#include "model/config.h"

#include <boost/json.hpp>

#include "model/config_json.h"
#include "model/gguf.h"

namespace dinfer {
namespace json = boost::json;
using config_json::GetNumber;
using config_json::ReadIdList;

namespace {

struct ArchAlias {
  std::string_view hf;
  std::string_view gguf;
  std::string_view arch;
};

constexpr ArchAlias kArchs[] = {
    {"LlamaForCausalLM", "llama", "llama"},
    {"Qwen2ForCausalLM", "qwen2", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3", "qwen3"},
    {"MistralForCausalLM", "mistral", "mistral"},
    {"DeepseekV4ForCausalLM", "deepseek_v4", "deepseek_v4"},
};

}  // namespace

std::string SupportedArchitectures() {
  std::string s;
  for (const auto& a : kArchs) {
    if (!s.empty()) s += ", ";
    s += a.hf;
  }
  return s;
}

Status ModelConfig::Validate() const {
  auto bad = [&](std::string_view what, int64_t v) {
    return InvalidArgument("model config: {} = {} is invalid", what, v);
  };
  if (vocab_size <= 0) return bad("vocab_size", vocab_size);
  if (hidden_size <= 0) return bad("hidden_size", hidden_size);
  if (intermediate_size <= 0) return bad("intermediate_size", intermediate_size);
  if (num_layers <= 0) return bad("num_hidden_layers", num_layers);
  if (num_heads <= 0) return bad("num_attention_heads", num_heads);
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0)
    return bad("num_key_value_heads", num_kv_heads);
  if (head_dim <= 0 || head_dim % 2 != 0) return bad("head_dim", head_dim);
  if (rotary_dim <= 0 || rotary_dim > head_dim || rotary_dim % 2 != 0)
    return bad("rotary_dim", rotary_dim);
  if (sliding_window < 0) return bad("sliding_window", sliding_window);
  if (deepseek_v4) return ValidateDeepseekV4(*this);
  return OkStatus();
}

StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, const std::string& path) {
  json::error_code ec;
  json::value root = json::parse(json_text, ec);
  if (ec || !root.is_object()) {
    return DataLoss("'{}' is not valid JSON: {}", path, ec ? ec.message() : "not an object");
  }
  const json::object& o = root.as_object();
  ModelConfig c;
  std::string model_type;
  if (const auto* mt = o.if_contains("model_type"); mt != nullptr && mt->is_string()) {
    model_type = std::string(mt->as_string());
  }
  if (const auto* a = o.if_contains("architectures");
      a != nullptr && a->is_array() && !a->as_array().empty() && a->as_array()[0].is_string()) {
    c.hf_architecture = std::string(a->as_array()[0].as_string());
  }
  for (const auto& a : kArchs) {
    if (c.hf_architecture == a.hf || (c.hf_architecture.empty() && model_type == a.gguf)) {
      c.arch = std::string(a.arch);
    }
  }
  if (c.arch.empty()) {
    return Unimplemented(
        "'{}': architecture '{}' (model_type '{}') is not supported; dinfer supports {}", path,
        c.hf_architecture, model_type, SupportedArchitectures());
  }
  if (c.arch == "deepseek_v4") {
    DINFER_RETURN_IF_ERROR(config_json::ParseDeepseekV4(o, path, &c));
    DINFER_RETURN_IF_ERROR(c.Validate().WithContext(path));
    return c;
  }
  GetNumber(o, "vocab_size", &c.vocab_size);
  GetNumber(o, "hidden_size", &c.hidden_size);
  GetNumber(o, "intermediate_size", &c.intermediate_size);
  GetNumber(o, "num_hidden_layers", &c.num_layers);
  GetNumber(o, "num_attention_heads", &c.num_heads);
  c.num_kv_heads = c.num_heads;
  GetNumber(o, "num_key_value_heads", &c.num_kv_heads);
  c.head_dim = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  GetNumber(o, "head_dim", &c.head_dim);
  c.rotary_dim = c.head_dim;
  double partial = 1.0;
  if (GetNumber(o, "partial_rotary_factor", &partial)) {
    c.rotary_dim = static_cast<int64_t>(c.head_dim * partial);
  }
  GetNumber(o, "max_position_embeddings", &c.max_position_embeddings);
  GetNumber(o, "rms_norm_eps", &c.rms_norm_eps);
  // transformers 5 moved rope_theta into rope_parameters; accept both.
  const json::object* rope = nullptr;
  if (const auto* rp = o.if_contains("rope_parameters"); rp != nullptr && rp->is_object()) {
    rope = &rp->as_object();
  } else if (const auto* rs = o.if_contains("rope_scaling"); rs != nullptr && rs->is_object()) {
    rope = &rs->as_object();
  }
  GetNumber(o, "rope_theta", &c.rope_theta);
  if (rope != nullptr) {
    GetNumber(*rope, "rope_theta", &c.rope_theta);
    std::string type = "default";
    for (const char* key : {"rope_type", "type"}) {
      if (const auto* t = rope->if_contains(key); t != nullptr && t->is_string()) {
        type = std::string(t->as_string());
      }
    }
    if (type == "llama3") {
      c.rope_scaling.type = RopeScalingType::kLlama3;
    } else if (type == "linear") {
      c.rope_scaling.type = RopeScalingType::kLinear;
    } else if (type != "default") {
      return Unimplemented(
          "'{}': rope scaling type '{}' is not supported (default, linear, llama3)", path, type);
    }
    GetNumber(*rope, "factor", &c.rope_scaling.factor);
    GetNumber(*rope, "low_freq_factor", &c.rope_scaling.low_freq_factor);
    GetNumber(*rope, "high_freq_factor", &c.rope_scaling.high_freq_factor);
    GetNumber(*rope, "original_max_position_embeddings", &c.rope_scaling.original_max_position);
  }
  GetNumber(o, "tie_word_embeddings", &c.tie_word_embeddings);
  if (c.arch == "qwen2") c.attention_bias = true;
  GetNumber(o, "attention_bias", &c.attention_bias);
  c.qk_norm = c.arch == "qwen3";
  c.layer_sliding.assign(static_cast<size_t>(std::max<int64_t>(c.num_layers, 0)), false);
  int64_t window = 0;
  const auto* sw = o.if_contains("sliding_window");
  if (sw != nullptr && !sw->is_null()) GetNumber(o, "sliding_window", &window);
  bool use_sliding = c.arch == "mistral";
  GetNumber(o, "use_sliding_window", &use_sliding);
  if (use_sliding && window > 0) {
    c.sliding_window = window;
    int64_t max_window_layers = c.arch == "mistral" ? 0 : c.num_layers;
    GetNumber(o, "max_window_layers", &max_window_layers);
    if (c.arch == "mistral") max_window_layers = 0;
    // Qwen2 applies the window to layers at index >= max_window_layers; Mistral to all.
    for (int64_t i = 0; i < c.num_layers; ++i) c.layer_sliding[i] = i >= max_window_layers;
    if (const auto* lt = o.if_contains("layer_types"); lt != nullptr && lt->is_array()) {
      const auto& arr = lt->as_array();
      for (size_t i = 0; i < arr.size() && i < c.layer_sliding.size(); ++i) {
        c.layer_sliding[i] = arr[i].is_string() && arr[i].as_string() == "sliding_attention";
      }
    }
  }
  ReadIdList(o.if_contains("eos_token_id"), &c.eos_token_ids);
  int64_t bos = -1;
  if (GetNumber(o, "bos_token_id", &bos)) c.bos_token_id = static_cast<int32_t>(bos);
  DINFER_RETURN_IF_ERROR(c.Validate().WithContext(path));
  return c;
}

StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& g) {
  ModelConfig c;
  const auto arch = g.GetString("general.architecture");
  if (!arch) return DataLoss("'{}' has no general.architecture", g.path());
  for (const auto& a : kArchs) {
    if (*arch == a.gguf && a.arch != "deepseek_v4") c.arch = std::string(a.arch);
  }
  if (c.arch.empty()) {
    return Unimplemented(
        "'{}': GGUF architecture '{}' is not supported; dinfer supports llama, qwen2, qwen3, "
        "mistral",
        g.path(), *arch);
  }
  const std::string p = *arch + ".";
  auto need = [&](const std::string& key, int64_t* out) -> Status {
    auto v = g.GetInt(p + key);
    if (!v) return DataLoss("'{}' lacks metadata '{}{}'", g.path(), p, key);
    *out = *v;
    return OkStatus();
  };
  DINFER_RETURN_IF_ERROR(need("embedding_length", &c.hidden_size));
  DINFER_RETURN_IF_ERROR(need("feed_forward_length", &c.intermediate_size));
  DINFER_RETURN_IF_ERROR(need("block_count", &c.num_layers));
  DINFER_RETURN_IF_ERROR(need("attention.head_count", &c.num_heads));
  c.num_kv_heads = g.GetInt(p + "attention.head_count_kv").value_or(c.num_heads);
  c.head_dim = g.GetInt(p + "attention.key_length").value_or(c.hidden_size / c.num_heads);
  c.rotary_dim = g.GetInt(p + "rope.dimension_count").value_or(c.head_dim);
  c.max_position_embeddings = g.GetInt(p + "context_length").value_or(4096);
  c.rms_norm_eps = g.GetFloat(p + "attention.layer_norm_rms_epsilon").value_or(1e-5);
  c.rope_theta = g.GetFloat(p + "rope.freq_base").value_or(10000.0);
  if (auto type = g.GetString(p + "rope.scaling.type"); type && *type == "linear") {
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = g.GetFloat(p + "rope.scaling.factor").value_or(1.0);
  }
  // llama.cpp's converter permutes Q/K of llama-family checkpoints for pairwise rotation.
  c.rope_interleaved = c.arch == "llama" || c.arch == "mistral";
  c.attention_bias = g.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = g.FindTensor("blk.0.attn_q_norm.weight") != nullptr;
  c.tie_word_embeddings = g.FindTensor("output.weight") == nullptr;
  c.sliding_window = g.GetInt(p + "attention.sliding_window").value_or(0);
  c.layer_sliding.assign(static_cast<size_t>(c.num_layers), c.sliding_window > 0);
  if (const auto* tokens = g.GetStringArray("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int64_t>(tokens->size());
  }
  c.vocab_size = g.GetInt(p + "vocab_size").value_or(c.vocab_size);
  if (const auto* emb = g.FindTensor("token_embd.weight")) c.vocab_size = emb->shape[0];
  if (auto eos = g.GetInt("tokenizer.ggml.eos_token_id"))
    c.eos_token_ids.push_back(static_cast<int32_t>(*eos));
  if (auto eot = g.GetInt("tokenizer.ggml.eot_token_id"))
    c.eos_token_ids.push_back(static_cast<int32_t>(*eot));
  if (auto bos = g.GetInt("tokenizer.ggml.bos_token_id"))
    c.bos_token_id = static_cast<int32_t>(*bos);
  DINFER_RETURN_IF_ERROR(c.Validate().WithContext(g.path()));
  return c;
}

}  // namespace dinfer
