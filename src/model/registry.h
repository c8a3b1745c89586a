// The architecture registry: arch name -> builder. A new architecture is one file in archs/
// plus one line in registry.cc. Read-only; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"

namespace dinfer {

using ArchBuilder = StatusOr<std::unique_ptr<Model>> (*)(const ModelConfig&, WeightSource&);

struct ArchEntry {
  const char* name;
  ArchBuilder build;
};

const std::vector<ArchEntry>& Architectures();
StatusOr<std::unique_ptr<Model>> BuildModel(const ModelConfig& config, WeightSource& weights);

// Builders, one per file in archs/.
StatusOr<std::unique_ptr<Model>> BuildLlama(const ModelConfig&, WeightSource&);
StatusOr<std::unique_ptr<Model>> BuildQwen2(const ModelConfig&, WeightSource&);
StatusOr<std::unique_ptr<Model>> BuildQwen3(const ModelConfig&, WeightSource&);
StatusOr<std::unique_ptr<Model>> BuildMistral(const ModelConfig&, WeightSource&);
StatusOr<std::unique_ptr<Model>> BuildDeepseekV4(const ModelConfig&, WeightSource&);

}  // namespace dinfer
