// DeepSeek-V4's config.json: DeepSeek's published keys (compress_ratios, num_hash_layers,
// qk_rope_head_dim, rope_scaling, quantization_config) and the ones transformers saves
// (layer_types, compress_rates, mlp_layer_types, partial_rotary_factor, nested rope_parameters).
// The semantics are transformers' deepseek_v4: compress ratio 0 / 4 / 128 names a sliding-window,
// compressed sparse or heavily compressed layer, and the rates come from compress_rates.
#include "model/config_json.h"

namespace dinfer::config_json {
namespace json = boost::json;

namespace {

StatusOr<V4Attention> KindFromRatio(int64_t ratio, const std::string& path) {
  switch (ratio) {
    case 0:
      return V4Attention::kSliding;
    case 4:
      return V4Attention::kCompressedSparse;
    case 128:
      return V4Attention::kHeavilyCompressed;
    default:
      return Unimplemented("'{}': compress ratio {} is not one of 0, 4, 128", path, ratio);
  }
}

StatusOr<V4Attention> KindFromName(std::string_view name, const std::string& path) {
  if (name == "sliding_attention") return V4Attention::kSliding;
  if (name == "compressed_sparse_attention") return V4Attention::kCompressedSparse;
  if (name == "heavily_compressed_attention") return V4Attention::kHeavilyCompressed;
  return Unimplemented("'{}': layer type '{}' is not a DeepSeek-V4 attention kind", path, name);
}

// A rope block: "default" leaves `out` unscaled, "yarn" sets YaRN's parameters.
Status ReadRope(const json::object& r, const std::string& path, double* theta, RopeScaling* out) {
  GetNumber(r, "rope_theta", theta);
  std::string type = "default";
  for (const char* key : {"type", "rope_type"}) {
    if (const auto* t = r.if_contains(key); t != nullptr && t->is_string()) {
      type = std::string(t->as_string());
    }
  }
  if (type == "default") return OkStatus();
  if (type != "yarn") {
    return Unimplemented("'{}': rope type '{}' is not supported for DeepSeek-V4 (default, yarn)",
                         path, type);
  }
  out->type = RopeScalingType::kYarn;
  GetNumber(r, "factor", &out->factor);
  GetNumber(r, "original_max_position_embeddings", &out->original_max_position);
  GetNumber(r, "beta_fast", &out->beta_fast);
  GetNumber(r, "beta_slow", &out->beta_slow);
  return OkStatus();
}

}  // namespace

Status ParseDeepseekV4(const json::object& o, const std::string& path, ModelConfig* c) {
  DeepseekV4Config v;
  GetNumber(o, "vocab_size", &c->vocab_size);
  GetNumber(o, "hidden_size", &c->hidden_size);
  GetNumber(o, "moe_intermediate_size", &c->intermediate_size);
  GetNumber(o, "num_hidden_layers", &c->num_layers);
  GetNumber(o, "num_attention_heads", &c->num_heads);
  c->num_kv_heads = 1;
  GetNumber(o, "num_key_value_heads", &c->num_kv_heads);
  GetNumber(o, "head_dim", &c->head_dim);
  c->rotary_dim = 64;
  double partial = 0;
  if (GetNumber(o, "partial_rotary_factor", &partial)) {
    c->rotary_dim = static_cast<int64_t>(static_cast<double>(c->head_dim) * partial);
  }
  GetNumber(o, "qk_rope_head_dim", &c->rotary_dim);
  GetNumber(o, "max_position_embeddings", &c->max_position_embeddings);
  GetNumber(o, "rms_norm_eps", &c->rms_norm_eps);
  GetNumber(o, "rope_theta", &c->rope_theta);
  GetNumber(o, "compress_rope_theta", &v.compress_rope_theta);
  c->sliding_window = 128;
  GetNumber(o, "sliding_window", &c->sliding_window);
  GetNumber(o, "tie_word_embeddings", &c->tie_word_embeddings);
  ReadIdList(o.if_contains("eos_token_id"), &c->eos_token_ids);
  int64_t bos = -1;
  if (GetNumber(o, "bos_token_id", &bos)) c->bos_token_id = static_cast<int32_t>(bos);

  // The main rotary is plain; YaRN, when configured, applies to the compressed layers' rotary
  // (theta compress_rope_theta) only, without YaRN's attention factor (transformers forces 1).
  if (const auto* rp = o.if_contains("rope_parameters"); rp != nullptr && rp->is_object()) {
    const auto& r = rp->as_object();
    const auto* main = r.if_contains("main");
    const auto* compress = r.if_contains("compress");
    if (main != nullptr && main->is_object() && compress != nullptr && compress->is_object()) {
      RopeScaling main_scaling;
      DINFER_RETURN_IF_ERROR(ReadRope(main->as_object(), path, &c->rope_theta, &main_scaling));
      if (main_scaling.type != RopeScalingType::kNone) {
        return Unimplemented("'{}': DeepSeek-V4's main rotary must be plain", path);
      }
      double partial_main = 0;
      if (GetNumber(main->as_object(), "partial_rotary_factor", &partial_main)) {
        c->rotary_dim = static_cast<int64_t>(static_cast<double>(c->head_dim) * partial_main);
      }
      DINFER_RETURN_IF_ERROR(
          ReadRope(compress->as_object(), path, &v.compress_rope_theta, &v.compress_rope));
    } else {
      double ignored = 0;
      DINFER_RETURN_IF_ERROR(ReadRope(r, path, &ignored, &v.compress_rope));
    }
  } else if (const auto* rs = o.if_contains("rope_scaling"); rs != nullptr && rs->is_object()) {
    double ignored = 0;
    DINFER_RETURN_IF_ERROR(ReadRope(rs->as_object(), path, &ignored, &v.compress_rope));
  }

  GetNumber(o, "q_lora_rank", &v.q_lora_rank);
  GetNumber(o, "o_lora_rank", &v.o_lora_rank);
  GetNumber(o, "o_groups", &v.o_groups);
  GetNumber(o, "index_n_heads", &v.index_heads);
  GetNumber(o, "index_head_dim", &v.index_head_dim);
  GetNumber(o, "index_topk", &v.index_topk);
  GetNumber(o, "hc_mult", &v.hc_mult);
  GetNumber(o, "hc_sinkhorn_iters", &v.hc_sinkhorn_iters);
  GetNumber(o, "hc_eps", &v.hc_eps);
  GetNumber(o, "n_routed_experts", &v.num_experts);
  GetNumber(o, "n_shared_experts", &v.num_shared_experts);
  GetNumber(o, "num_experts_per_tok", &v.experts_per_token);
  GetNumber(o, "norm_topk_prob", &v.norm_topk_prob);
  GetNumber(o, "routed_scaling_factor", &v.routed_scaling);
  GetNumber(o, "swiglu_limit", &v.swiglu_limit);
  v.num_mtp_layers = 1;
  GetNumber(o, "num_nextn_predict_layers", &v.num_mtp_layers);
  if (const auto* sf = o.if_contains("scoring_func"); sf != nullptr && sf->is_string()) {
    const std::string_view name = sf->as_string();
    if (name == "sqrtsoftplus") {
      v.scoring = DeepseekV4Config::Scoring::kSqrtSoftplus;
    } else if (name == "softmax") {
      v.scoring = DeepseekV4Config::Scoring::kSoftmax;
    } else if (name == "sigmoid") {
      v.scoring = DeepseekV4Config::Scoring::kSigmoid;
    } else {
      return Unimplemented("'{}': scoring_func '{}' is not supported", path, name);
    }
  }

  const int64_t n = c->num_layers, total = n + std::max<int64_t>(v.num_mtp_layers, 0);
  if (n <= 0) return InvalidArgument("'{}': num_hidden_layers must be positive", path);
  if (const auto* cr = o.if_contains("compress_rates"); cr != nullptr && cr->is_object()) {
    GetNumber(cr->as_object(), "compressed_sparse_attention", &v.csa_rate);
    GetNumber(cr->as_object(), "heavily_compressed_attention", &v.hca_rate);
  }
  GetNumber(o, "compress_rate_csa", &v.csa_rate);
  GetNumber(o, "compress_rate_hca", &v.hca_rate);
  // Layers past the given list (the MTP layers of transformers' configs) are sliding-window only.
  v.layer_attention.assign(static_cast<size_t>(total), V4Attention::kSliding);
  if (const auto* lt = o.if_contains("layer_types"); lt != nullptr && lt->is_array()) {
    const auto& arr = lt->as_array();
    for (size_t i = 0; i < arr.size() && i < v.layer_attention.size(); ++i) {
      if (!arr[i].is_string()) return DataLoss("'{}': layer_types[{}] is not a string", path, i);
      DINFER_ASSIGN_OR_RETURN(v.layer_attention[i], KindFromName(arr[i].as_string(), path));
    }
  } else if (const auto* cr = o.if_contains("compress_ratios"); cr != nullptr && cr->is_array()) {
    const auto& arr = cr->as_array();
    if (static_cast<int64_t>(arr.size()) < n) {
      return DataLoss("'{}': compress_ratios has {} entries for {} layers", path, arr.size(), n);
    }
    for (size_t i = 0; i < arr.size() && i < v.layer_attention.size(); ++i) {
      if (!arr[i].is_number())
        return DataLoss("'{}': compress_ratios[{}] is not a number", path, i);
      DINFER_ASSIGN_OR_RETURN(v.layer_attention[i],
                              KindFromRatio(arr[i].to_number<int64_t>(), path));
    }
  } else {
    // transformers' default: two heavily compressed layers, then sparse and heavy alternating.
    for (int64_t i = 0; i < n; ++i) {
      v.layer_attention[i] =
          i < 2 || i % 2 == 0 ? V4Attention::kHeavilyCompressed : V4Attention::kCompressedSparse;
    }
  }
  v.layer_hash_moe.assign(static_cast<size_t>(total), false);
  if (const auto* mt = o.if_contains("mlp_layer_types"); mt != nullptr && mt->is_array()) {
    const auto& arr = mt->as_array();
    for (size_t i = 0; i < arr.size() && i < v.layer_hash_moe.size(); ++i) {
      v.layer_hash_moe[i] = arr[i].is_string() && arr[i].as_string() == "hash_moe";
    }
  } else {
    int64_t num_hash = 3;
    GetNumber(o, "num_hash_layers", &num_hash);
    for (int64_t i = 0; i < std::min(num_hash, n); ++i) v.layer_hash_moe[i] = true;
  }
  if (const auto* q = o.if_contains("quantization_config"); q != nullptr && q->is_object()) {
    if (const auto* bs = q->as_object().if_contains("weight_block_size");
        bs != nullptr && bs->is_array() && bs->as_array().size() == 2) {
      v.fp8_block_rows = bs->as_array()[0].to_number<int64_t>();
      v.fp8_block_cols = bs->as_array()[1].to_number<int64_t>();
    }
  }
  // Only layers without compressed entries stop reading blocks that fall out of the window; the
  // others keep compressed entries in the blocks of all earlier tokens.
  c->layer_sliding.assign(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < n; ++i)
    c->layer_sliding[i] = v.layer_attention[i] == V4Attention::kSliding;
  c->deepseek_v4 = std::move(v);
  return OkStatus();
}

}  // namespace dinfer::config_json

namespace dinfer {

Status ValidateDeepseekV4(const ModelConfig& c) {
  const DeepseekV4Config& v = *c.deepseek_v4;
  auto bad = [&](std::string_view what, int64_t value) {
    return InvalidArgument("DeepSeek-V4 config: {} = {} is invalid", what, value);
  };
  if (c.num_kv_heads != 1) return bad("num_key_value_heads (must be 1)", c.num_kv_heads);
  if (c.sliding_window <= 0) return bad("sliding_window", c.sliding_window);
  if (v.q_lora_rank <= 0) return bad("q_lora_rank", v.q_lora_rank);
  if (v.o_groups <= 0 || c.num_heads % v.o_groups != 0) return bad("o_groups", v.o_groups);
  if (v.o_lora_rank <= 0) return bad("o_lora_rank", v.o_lora_rank);
  if (v.hc_mult <= 0) return bad("hc_mult", v.hc_mult);
  if (v.hc_sinkhorn_iters <= 0) return bad("hc_sinkhorn_iters", v.hc_sinkhorn_iters);
  if (v.num_experts <= 0) return bad("n_routed_experts", v.num_experts);
  if (v.num_shared_experts < 0) return bad("n_shared_experts", v.num_shared_experts);
  if (v.experts_per_token <= 0 || v.experts_per_token > v.num_experts)
    return bad("num_experts_per_tok", v.experts_per_token);
  if (v.csa_rate <= 0) return bad("compressed sparse attention rate", v.csa_rate);
  if (v.hca_rate <= 0) return bad("heavily compressed attention rate", v.hca_rate);
  if (v.num_mtp_layers < 0) return bad("num_nextn_predict_layers", v.num_mtp_layers);
  if (v.fp8_block_rows <= 0) return bad("weight_block_size[0]", v.fp8_block_rows);
  if (v.fp8_block_cols <= 0 || v.fp8_block_cols % 32 != 0)
    return bad("weight_block_size[1] (a multiple of 32)", v.fp8_block_cols);
  bool sparse = false;
  for (V4Attention a : v.layer_attention) sparse = sparse || a == V4Attention::kCompressedSparse;
  if (sparse) {
    if (v.index_heads <= 0) return bad("index_n_heads", v.index_heads);
    if (v.index_topk <= 0) return bad("index_topk", v.index_topk);
    if (v.index_head_dim < c.rotary_dim) return bad("index_head_dim", v.index_head_dim);
  }
  return OkStatus();
}

}  // namespace dinfer
