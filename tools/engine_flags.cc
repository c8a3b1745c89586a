#include "tools/engine_flags.h"

namespace dinfer::tools {

void AddEngineFlags(CLI::App& cmd, EngineOptions& o, unsigned sets) {
  if (sets & kModelFlags) {
    cmd.add_option("-m,--model", o.model, "\"default\", an HF model directory or a .gguf file")
        ->capture_default_str();
    cmd.add_flag("--f32-activations", o.f32_activations,
                 "quantized models: multiply dequantized weights with f32 activations (the "
                 "numerics of reference implementations; slower) instead of 8-bit activations");
    cmd.add_option("--device", o.device, "cpu, cuda, or auto (the GPU when there is one)")
        ->capture_default_str();
    cmd.add_option("--quantization", o.quantization,
                   "none, or fp8 (CUDA: layer weights as e4m3 with per-channel scales, FP8 GEMMs)")
        ->capture_default_str();
  }
  if (sets & kThreadFlags) {
    cmd.add_option("-t,--threads", o.threads, "CPU threads (0 = all cores)")->capture_default_str();
  }
  if (sets & kCacheFlags) {
    cmd.add_option("--kv-cache-mib", o.kv_cache_mib, "KV cache memory in MiB")
        ->capture_default_str();
    cmd.add_option("--block-size", o.block_size, "tokens per KV cache block")
        ->capture_default_str();
    cmd.add_option("--kv-cache-dtype", o.kv_cache_dtype,
                   "KV cache storage: auto (CPU: the model's choice; CUDA: bf16), f32 (CPU), bf16, "
                   "or fp8 (e4m3: CUDA, and DeepSeek-V4 on the CPU; about twice the tokens in the "
                   "same memory)")
        ->check(CLI::IsMember({"auto", "f32", "bf16", "fp8"}))
        ->capture_default_str();
    cmd.add_option("--kv-cache-scale", o.kv_cache_scale,
                   "with --kv-cache-dtype fp8: the cache stores K / scale and V / scale (for "
                   "layers without calibrated k_scale / v_scale in the checkpoint)")
        ->capture_default_str();
    cmd.add_flag_callback(
        "--no-prefix-cache", [&o] { o.enable_prefix_caching = false; }, "disable prefix caching");
    cmd.add_option("--swa-replay-tokens", o.swa_replay_tokens,
                   "DeepSeek-V4 prefix hits whose window KV is gone recompute this many tokens "
                   "before the hit (0 = the exact bound; fewer, e.g. DeepInfer's 140, "
                   "approximate the window)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
  }
  if (sets & kBatchingFlags) {
    cmd.add_option("--max-batched-tokens", o.max_num_batched_tokens,
                   "tokens per engine step at most (<= 32768)")
        ->capture_default_str();
    cmd.add_option("--step-time-budget-ms", o.step_time_budget_ms,
                   "cut prompt chunks so that a step's predicted time stays within this (0 = off)")
        ->capture_default_str();
    cmd.add_option("--cost-profile", o.cost_profile,
                   "file to load the step cost model from, or save it to once fitted");
    cmd.add_option("--num-speculative-tokens", o.num_speculative_tokens,
                   "draft tokens per decode step from the model's MTP layer (0 = off, 1)")
        ->capture_default_str();
    cmd.add_option("--speculative-min-confidence", o.speculative_min_confidence,
                   "propose a draft only when the MTP layer's probability of it is at least this "
                   "(0..1; 0 = every draft)")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    cmd.add_option("--speculative-min-acceptance", o.speculative_min_acceptance,
                   "stop drafting for a request whose recent draft acceptance rate falls below "
                   "this, probing once every 8 steps to resume (0..1; 0 = off)")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
  }
  if (sets & kServingFlags) {
    cmd.add_option("--max-num-seqs", o.max_num_seqs, "requests running at once at most")
        ->capture_default_str();
    cmd.add_option("--max-model-len", o.max_model_len,
                   "prompt + output tokens per request at most (0 = the model's context)")
        ->capture_default_str();
  }
}

}  // namespace dinfer::tools
