// GgufFile: a parsed GGUF file (v2/v3): metadata key/values and tensor descriptors, with the
// tensor data read in place from a memory mapping. Parsing validates every offset and size,
// so a truncated or malformed file yields a DATA_LOSS status naming the file, never a crash.
// Immutable after Open; safe to share between threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace dinfer {

struct GgufValue {
  // Scalars: integers (all widths, bool) as int64, floats as double, strings as string.
  // Arrays: one of the vectors, by element kind.
  std::variant<int64_t, uint64_t, double, std::string, std::vector<int64_t>, std::vector<double>,
               std::vector<std::string>>
      value;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // outermost first (reversed from GGUF's ne order): [rows, cols]
  uint32_t ggml_type = 0;
  std::optional<DType> dtype;  // nullopt when dinfer does not support the ggml type
  uint64_t offset = 0;         // relative to the data section
  uint64_t nbytes = 0;
};

class GgufFile {
 public:
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  const GgufValue* Find(const std::string& key) const;
  std::optional<std::string> GetString(const std::string& key) const;
  std::optional<int64_t> GetInt(const std::string& key) const;
  std::optional<double> GetFloat(const std::string& key) const;  // ints convert too
  std::optional<bool> GetBool(const std::string& key) const;
  const std::vector<std::string>* GetStringArray(const std::string& key) const;
  const std::vector<int64_t>* GetIntArray(const std::string& key) const;
  const std::vector<double>* GetFloatArray(const std::string& key) const;

  const GgufTensorInfo* FindTensor(const std::string& name) const;
  // A view of a tensor's bytes inside the mapping; errors on unsupported dtypes.
  StatusOr<TensorView> TensorData(const GgufTensorInfo& info) const;

  static std::string_view GgmlTypeName(uint32_t ggml_type);

 private:
  GgufFile() = default;
  Status Parse();

  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace dinfer
