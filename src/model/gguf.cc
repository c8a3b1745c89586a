#include "model/gguf.h"

#include <cstring>

namespace dinfer {
namespace {

enum GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

struct GgmlTypeInfo {
  uint32_t id;
  std::string_view name;
  std::optional<DType> dtype;
  int64_t block_size;
  int64_t block_bytes;
};

// ggml's type ids. Types we cannot compute with are listed so errors can name them.
constexpr GgmlTypeInfo kGgmlTypes[] = {
    {0, "F32", DType::kF32, 1, 4},        {1, "F16", DType::kF16, 1, 2},
    {2, "Q4_0", DType::kQ4_0, 32, 18},    {3, "Q4_1", DType::kQ4_1, 32, 20},
    {6, "Q5_0", std::nullopt, 32, 22},    {7, "Q5_1", std::nullopt, 32, 24},
    {8, "Q8_0", DType::kQ8_0, 32, 34},    {9, "Q8_1", std::nullopt, 32, 36},
    {10, "Q2_K", std::nullopt, 256, 84},  {11, "Q3_K", std::nullopt, 256, 110},
    {12, "Q4_K", DType::kQ4_K, 256, 144}, {13, "Q5_K", std::nullopt, 256, 176},
    {14, "Q6_K", DType::kQ6_K, 256, 210}, {15, "Q8_K", std::nullopt, 256, 292},
    {24, "I8", std::nullopt, 1, 1},       {25, "I16", std::nullopt, 1, 2},
    {26, "I32", DType::kI32, 1, 4},       {27, "I64", DType::kI64, 1, 8},
    {28, "F64", std::nullopt, 1, 8},      {30, "BF16", DType::kBF16, 1, 2},
};

const GgmlTypeInfo* FindGgmlType(uint32_t id) {
  for (const auto& t : kGgmlTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

// Bounds-checked little-endian reader over the mapping.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  size_t pos() const { return pos_; }

  template <typename T>
  Status Read(T* out) {
    if (size_ - pos_ < sizeof(T)) return Truncated(sizeof(T));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return OkStatus();
  }

  Status ReadString(std::string* out) {
    uint64_t len = 0;
    DINFER_RETURN_IF_ERROR(Read(&len));
    if (size_ - pos_ < len) return Truncated(len);
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return OkStatus();
  }

  Status Truncated(uint64_t want) const {
    return DataLoss(
        "'{}' is truncated or malformed: needs {} more bytes at offset {} (file is {} bytes)",
        path_, want, pos_, size_);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

Status ReadScalarInt(Cursor& c, uint32_t type, int64_t* out, uint64_t* out_u64) {
  switch (type) {
    case kU8: {
      uint8_t v;
      DINFER_RETURN_IF_ERROR(c.Read(&v));
      *out = v;
      return OkStatus();
    }
    case kI8: {
      int8_t v;
      DINFER_RETURN_IF_ERROR(c.Read(&v));
      *out = v;
      return OkStatus();
    }
    case kU16: {
      uint16_t v;
      DINFER_RETURN_IF_ERROR(c.Read(&v));
      *out = v;
      return OkStatus();
    }
    case kI16: {
      int16_t v;
      DINFER_RETURN_IF_ERROR(c.Read(&v));
      *out = v;
      return OkStatus();
    }
    case kU32: {
      uint32_t v;
      DINFER_RETURN_IF_ERROR(c.Read(&v));
      *out = v;
      return OkStatus();
    }
    case kI32: {
      int32_t v;
      DINFER_RETURN_IF_ERROR(c.Read(&v));
      *out = v;
      return OkStatus();
    }
    case kBool: {
      uint8_t v;
      DINFER_RETURN_IF_ERROR(c.Read(&v));
      *out = v != 0;
      return OkStatus();
    }
    case kI64: {
      int64_t v;
      DINFER_RETURN_IF_ERROR(c.Read(&v));
      *out = v;
      return OkStatus();
    }
    case kU64: {
      uint64_t v;
      DINFER_RETURN_IF_ERROR(c.Read(&v));
      *out = static_cast<int64_t>(v);
      if (out_u64 != nullptr) *out_u64 = v;
      return OkStatus();
    }
    default:
      return Internal("not an integer type {}", type);
  }
}

bool IsIntType(uint32_t t) {
  return t == kU8 || t == kI8 || t == kU16 || t == kI16 || t == kU32 || t == kI32 || t == kBool ||
         t == kI64 || t == kU64;
}

Status ReadValue(Cursor& c, uint32_t type, const std::string& key, const std::string& path,
                 GgufValue* out) {
  if (IsIntType(type)) {
    int64_t v = 0;
    uint64_t u = 0;
    DINFER_RETURN_IF_ERROR(ReadScalarInt(c, type, &v, &u));
    if (type == kU64)
      out->value = u;
    else
      out->value = v;
    return OkStatus();
  }
  switch (type) {
    case kF32: {
      float v;
      DINFER_RETURN_IF_ERROR(c.Read(&v));
      out->value = double{v};
      return OkStatus();
    }
    case kF64: {
      double v;
      DINFER_RETURN_IF_ERROR(c.Read(&v));
      out->value = v;
      return OkStatus();
    }
    case kString: {
      std::string s;
      DINFER_RETURN_IF_ERROR(c.ReadString(&s));
      out->value = std::move(s);
      return OkStatus();
    }
    case kArray: {
      uint32_t elem = 0;
      uint64_t n = 0;
      DINFER_RETURN_IF_ERROR(c.Read(&elem));
      DINFER_RETURN_IF_ERROR(c.Read(&n));
      if (n > (1ull << 32)) {
        return DataLoss("'{}' is malformed: metadata '{}' claims {} array elements", path, key, n);
      }
      if (elem == kString) {
        std::vector<std::string> v(n);
        for (auto& s : v) DINFER_RETURN_IF_ERROR(c.ReadString(&s));
        out->value = std::move(v);
      } else if (elem == kF32 || elem == kF64) {
        std::vector<double> v(n);
        for (auto& x : v) {
          if (elem == kF32) {
            float f;
            DINFER_RETURN_IF_ERROR(c.Read(&f));
            x = f;
          } else {
            DINFER_RETURN_IF_ERROR(c.Read(&x));
          }
        }
        out->value = std::move(v);
      } else if (IsIntType(elem)) {
        std::vector<int64_t> v(n);
        for (auto& x : v) DINFER_RETURN_IF_ERROR(ReadScalarInt(c, elem, &x, nullptr));
        out->value = std::move(v);
      } else {
        return DataLoss("'{}' is malformed: metadata '{}' has arrays of unsupported type {}", path,
                        key, elem);
      }
      return OkStatus();
    }
    default:
      return DataLoss("'{}' is malformed: metadata '{}' has unknown value type {}", path, key,
                      type);
  }
}

}  // namespace

std::string_view GgufFile::GgmlTypeName(uint32_t ggml_type) {
  const auto* t = FindGgmlType(ggml_type);
  return t != nullptr ? t->name : "unknown";
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  DINFER_ASSIGN_OR_RETURN(f->file_, MappedFile::Open(path));
  DINFER_RETURN_IF_ERROR(f->Parse());
  return f;
}

Status GgufFile::Parse() {
  const std::string& p = file_->path();
  Cursor c(file_->data(), file_->size(), p);
  uint32_t magic = 0;
  if (file_->size() < 4)
    return DataLoss("'{}' is not a GGUF file: only {} bytes", p, file_->size());
  DINFER_RETURN_IF_ERROR(c.Read(&magic));
  if (magic != 0x46554747u) return DataLoss("'{}' is not a GGUF file (bad magic)", p);
  DINFER_RETURN_IF_ERROR(c.Read(&version_));
  if (version_ < 2 || version_ > 3) {
    return Unimplemented("'{}' has GGUF version {}; versions 2 and 3 are supported", p, version_);
  }
  uint64_t n_tensors = 0, n_kv = 0;
  DINFER_RETURN_IF_ERROR(c.Read(&n_tensors));
  DINFER_RETURN_IF_ERROR(c.Read(&n_kv));
  if (n_tensors > (1u << 24) || n_kv > (1u << 24)) {
    return DataLoss("'{}' is malformed: {} tensors, {} metadata entries", p, n_tensors, n_kv);
  }
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    uint32_t type = 0;
    DINFER_RETURN_IF_ERROR(c.ReadString(&key));
    DINFER_RETURN_IF_ERROR(c.Read(&type));
    GgufValue v;
    DINFER_RETURN_IF_ERROR(ReadValue(c, type, key, p, &v));
    metadata_[key] = std::move(v);
  }
  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    uint32_t n_dims = 0;
    DINFER_RETURN_IF_ERROR(c.ReadString(&t.name));
    DINFER_RETURN_IF_ERROR(c.Read(&n_dims));
    if (n_dims == 0 || n_dims > 4) {
      return DataLoss("'{}' is malformed: tensor '{}' has {} dimensions", p, t.name, n_dims);
    }
    std::vector<int64_t> ne(n_dims);
    int64_t numel = 1;
    for (auto& d : ne) {
      uint64_t v = 0;
      DINFER_RETURN_IF_ERROR(c.Read(&v));
      if (v == 0 || v > (1ull << 40)) {
        return DataLoss("'{}' is malformed: tensor '{}' has a dimension of {}", p, t.name, v);
      }
      d = static_cast<int64_t>(v);
      numel *= d;
    }
    t.shape.assign(ne.rbegin(), ne.rend());
    DINFER_RETURN_IF_ERROR(c.Read(&t.ggml_type));
    DINFER_RETURN_IF_ERROR(c.Read(&t.offset));
    const GgmlTypeInfo* info = FindGgmlType(t.ggml_type);
    if (info == nullptr) {
      return DataLoss("'{}' is malformed: tensor '{}' has unknown ggml type {}", p, t.name,
                      t.ggml_type);
    }
    if (ne[0] % info->block_size != 0) {
      return DataLoss(
          "'{}' is malformed: tensor '{}' row length {} is not a multiple of {}'s block {}", p,
          t.name, ne[0], info->name, info->block_size);
    }
    t.dtype = info->dtype;
    t.nbytes = static_cast<uint64_t>(numel / info->block_size * info->block_bytes);
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  uint64_t alignment = 32;
  if (auto a = GetInt("general.alignment")) {
    if (*a <= 0 || (*a & (*a - 1)) != 0) {
      return DataLoss("'{}' is malformed: general.alignment = {}", p, *a);
    }
    alignment = static_cast<uint64_t>(*a);
  }
  data_offset_ = (c.pos() + alignment - 1) / alignment * alignment;
  for (const auto& t : tensors_) {
    const uint64_t end = data_offset_ + t.offset + t.nbytes;
    if (t.offset + t.nbytes < t.offset || end > file_->size()) {
      return DataLoss(
          "'{}' is truncated: tensor '{}' needs bytes up to offset {} but the file has {} bytes", p,
          t.name, end, file_->size());
    }
  }
  return OkStatus();
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::optional<std::string> GgufFile::GetString(const std::string& key) const {
  const auto* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* s = std::get_if<std::string>(&v->value)) return *s;
  return std::nullopt;
}

std::optional<int64_t> GgufFile::GetInt(const std::string& key) const {
  const auto* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&v->value)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v->value)) return static_cast<int64_t>(*u);
  return std::nullopt;
}

std::optional<double> GgufFile::GetFloat(const std::string& key) const {
  const auto* v = Find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* d = std::get_if<double>(&v->value)) return *d;
  if (auto i = GetInt(key)) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<bool> GgufFile::GetBool(const std::string& key) const {
  if (auto i = GetInt(key)) return *i != 0;
  return std::nullopt;
}

const std::vector<std::string>* GgufFile::GetStringArray(const std::string& key) const {
  const auto* v = Find(key);
  return v == nullptr ? nullptr : std::get_if<std::vector<std::string>>(&v->value);
}

const std::vector<int64_t>* GgufFile::GetIntArray(const std::string& key) const {
  const auto* v = Find(key);
  return v == nullptr ? nullptr : std::get_if<std::vector<int64_t>>(&v->value);
}

const std::vector<double>* GgufFile::GetFloatArray(const std::string& key) const {
  const auto* v = Find(key);
  return v == nullptr ? nullptr : std::get_if<std::vector<double>>(&v->value);
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

StatusOr<TensorView> GgufFile::TensorData(const GgufTensorInfo& info) const {
  if (!info.dtype) {
    return Unimplemented("'{}': tensor '{}' has ggml type {} which dinfer cannot compute with yet",
                         path(), info.name, GgmlTypeName(info.ggml_type));
  }
  void* ptr = const_cast<uint8_t*>(file_->data() + data_offset_ + info.offset);
  return TensorView::Make(ptr, *info.dtype, info.shape);
}

}  // namespace dinfer
