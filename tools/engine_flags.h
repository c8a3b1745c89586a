// The engine flags that serve, generate and bench share, so that each means the same everywhere.
#pragma once

#include <CLI/CLI.hpp>

#include "dinfer/engine.h"

namespace dinfer::tools {

// Which groups of flags a command takes.
enum EngineFlagSet : unsigned {
  kModelFlags = 1,     // -m/--model, --f32-activations, --device
  kThreadFlags = 2,    // -t/--threads
  kCacheFlags = 4,     // --kv-cache-mib, --block-size, --no-prefix-cache
  kBatchingFlags = 8,  // --max-batched-tokens, --step-time-budget-ms, --cost-profile,
                       // --num-speculative-tokens, --speculative-min-confidence,
                       // --speculative-min-acceptance
  kServingFlags = 16,  // --max-num-seqs, --max-model-len
  kAllEngineFlags = 31,
};

void AddEngineFlags(CLI::App& cmd, EngineOptions& options, unsigned sets);

}  // namespace dinfer::tools
