#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include <boost/json.hpp>

namespace dinfer {
namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

std::optional<DType> SafetensorsDType(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  if (name == "I8") return DType::kI8;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "F8_E8M0") return DType::kF8E8M0;
  return std::nullopt;
}

int64_t SafetensorsElemBytes(std::string_view name) {
  if (name == "F64" || name == "I64" || name == "U64") return 8;
  if (name == "F32" || name == "I32" || name == "U32") return 4;
  if (name == "F16" || name == "BF16" || name == "I16" || name == "U16") return 2;
  if (name == "I8" || name == "U8" || name == "BOOL" || name == "F8_E4M3" || name == "F8_E5M2" ||
      name == "F8_E8M0")
    return 1;
  return 0;
}

}  // namespace

StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::OpenDir(
    const std::string& dir) {
  std::vector<std::string> files;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index, ec)) {
    DINFER_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index.string()));
    json::error_code jec;
    json::value v = json::parse(text, jec);
    if (jec || !v.is_object() || !v.as_object().contains("weight_map") ||
        !v.at("weight_map").is_object()) {
      return DataLoss("'{}' is malformed: expected a JSON object with a 'weight_map'",
                      index.string());
    }
    std::set<std::string> shards;
    for (const auto& kv : v.at("weight_map").as_object()) {
      if (!kv.value().is_string()) {
        return DataLoss("'{}' is malformed: weight_map['{}'] is not a file name", index.string(),
                        std::string(kv.key()));
      }
      shards.insert(std::string(kv.value().as_string()));
    }
    for (const auto& s : shards) files.push_back((fs::path(dir) / s).string());
  } else {
    if (!fs::is_directory(dir, ec)) return NotFound("model directory '{}' does not exist", dir);
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) return NotFound("no *.safetensors files in '{}'", dir);
  }
  return OpenFiles(files);
}

StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::OpenFiles(
    const std::vector<std::string>& files) {
  auto ckpt = std::make_unique<SafetensorsCheckpoint>();
  for (const auto& f : files) DINFER_RETURN_IF_ERROR(ckpt->AddFile(f));
  return ckpt;
}

Status SafetensorsCheckpoint::AddFile(const std::string& path) {
  DINFER_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> file, MappedFile::Open(path));
  if (file->size() < 8) return DataLoss("'{}' is truncated: no safetensors header", path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, file->data(), 8);
  if (header_len > file->size() - 8 || header_len > (100u << 20)) {
    return DataLoss("'{}' is truncated or malformed: header of {} bytes in a {}-byte file", path,
                    header_len, file->size());
  }
  json::error_code jec;
  json::value header = json::parse(
      std::string_view(reinterpret_cast<const char*>(file->data()) + 8, header_len), jec);
  if (jec || !header.is_object()) {
    return DataLoss("'{}' is malformed: header is not a JSON object ({})", path, jec.message());
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file->size() - data_start;
  for (const auto& kv : header.as_object()) {
    const std::string name(kv.key());
    if (name == "__metadata__") continue;
    const auto* obj = kv.value().if_object();
    if (obj == nullptr || !obj->contains("dtype") || !obj->contains("shape") ||
        !obj->contains("data_offsets")) {
      return DataLoss("'{}' is malformed: entry '{}' lacks dtype/shape/data_offsets", path, name);
    }
    const auto* dtype = obj->at("dtype").if_string();
    const auto* shape = obj->at("shape").if_array();
    const auto* offsets = obj->at("data_offsets").if_array();
    if (dtype == nullptr || shape == nullptr || offsets == nullptr || offsets->size() != 2) {
      return DataLoss("'{}' is malformed: entry '{}' has bad dtype/shape/data_offsets", path, name);
    }
    std::vector<int64_t> dims;
    int64_t numel = 1;
    for (const auto& d : *shape) {
      if (!d.is_int64() && !d.is_uint64())
        return DataLoss("'{}': '{}' has a bad shape", path, name);
      dims.push_back(d.to_number<int64_t>());
      if (dims.back() < 0) return DataLoss("'{}': '{}' has a negative dimension", path, name);
      numel *= dims.back();
    }
    const uint64_t begin = (*offsets)[0].to_number<uint64_t>();
    const uint64_t end = (*offsets)[1].to_number<uint64_t>();
    const std::string dtype_name(*dtype);
    const int64_t elem = SafetensorsElemBytes(dtype_name);
    if (elem == 0) return DataLoss("'{}': '{}' has unknown dtype '{}'", path, name, dtype_name);
    if (end < begin || end > data_size) {
      return DataLoss("'{}' is truncated: tensor '{}' ends at byte {} of a {}-byte data section",
                      path, name, end, data_size);
    }
    if (end - begin != static_cast<uint64_t>(numel * elem)) {
      return DataLoss("'{}' is malformed: tensor '{}' has {} bytes for {} elements of {}", path,
                      name, end - begin, numel, dtype_name);
    }
    SafetensorsEntry entry;
    entry.file = path;
    entry.dtype_name = dtype_name;
    const auto dt = SafetensorsDType(dtype_name);
    // Unsupported dtypes keep a typeless view; the model builder reports them if it needs them.
    entry.view = TensorView::Make(const_cast<uint8_t*>(file->data() + data_start + begin),
                                  dt.value_or(DType::kI32), dims);
    if (!dt) entry.view.data = nullptr;
    if (tensors_.count(name) != 0) {
      return DataLoss("tensor '{}' appears in both '{}' and '{}'", name, tensors_[name].file, path);
    }
    tensors_[name] = std::move(entry);
  }
  total_bytes_ += file->size();
  files_.push_back(std::move(file));
  return OkStatus();
}

const SafetensorsEntry* SafetensorsCheckpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace dinfer
