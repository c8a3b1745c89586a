// Safetensors checkpoints: one file or a sharded set (model.safetensors.index.json), memory-mapped.
// Headers are validated (dtype, shape, offsets within the file) so a truncated or malformed file
// yields a DATA_LOSS status naming it. Immutable after Open; safe to share between threads.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace dinfer {

struct SafetensorsEntry {
  std::string file;
  TensorView view;
  std::string dtype_name;  // as written in the header ("F32", "BF16", ...)
};

class SafetensorsCheckpoint {
 public:
  // `dir` holds model.safetensors, or model.safetensors.index.json and its shards, or any set
  // of *.safetensors files.
  static StatusOr<std::unique_ptr<SafetensorsCheckpoint>> OpenDir(const std::string& dir);
  static StatusOr<std::unique_ptr<SafetensorsCheckpoint>> OpenFiles(
      const std::vector<std::string>& files);

  const std::map<std::string, SafetensorsEntry>& tensors() const { return tensors_; }
  const SafetensorsEntry* Find(const std::string& name) const;
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  Status AddFile(const std::string& path);

  std::vector<std::shared_ptr<MappedFile>> files_;
  std::map<std::string, SafetensorsEntry> tensors_;
  uint64_t total_bytes_ = 0;
};

}  // namespace dinfer
