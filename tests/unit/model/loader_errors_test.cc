// Loading broken inputs yields clear Status errors naming the file, never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/gguf.h"
#include "model/loader.h"
#include "model/safetensors.h"

namespace dinfer {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("dinfer_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& bytes) const {
    const fs::path p = path_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

template <typename T>
void Put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void PutStr(std::string& s, const std::string& v) {
  Put<uint64_t>(s, v.size());
  s += v;
}

// A minimal valid GGUF with one F32 tensor of `n` elements and the given architecture.
std::string MakeGguf(const std::string& arch, uint64_t n, bool with_data = true) {
  std::string s;
  Put<uint32_t>(s, 0x46554747u);
  Put<uint32_t>(s, 3);
  Put<uint64_t>(s, 1);  // tensors
  Put<uint64_t>(s, 1);  // kv
  PutStr(s, "general.architecture");
  Put<uint32_t>(s, 8);
  PutStr(s, arch);
  PutStr(s, "token_embd.weight");
  Put<uint32_t>(s, 1);
  Put<uint64_t>(s, n);
  Put<uint32_t>(s, 0);  // F32
  Put<uint64_t>(s, 0);
  while (s.size() % 32) s.push_back('\0');
  if (with_data) s.append(n * 4, '\0');
  return s;
}

TEST(GgufErrors, MissingFile) {
  auto f = GgufFile::Open("/nonexistent/model.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("/nonexistent/model.gguf"), std::string::npos);
}

TEST(GgufErrors, BadMagic) {
  TempDir d;
  auto f = GgufFile::Open(d.Write("x.gguf", "NOPE and some more bytes"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("x.gguf"), std::string::npos);
}

TEST(GgufErrors, EveryTruncationIsAnError) {
  TempDir d;
  const std::string full = MakeGguf("llama", 64);
  ASSERT_TRUE(GgufFile::Open(d.Write("ok.gguf", full)).ok());
  for (size_t len = 0; len < full.size(); len += 7) {
    auto f = GgufFile::Open(d.Write("t.gguf", full.substr(0, len)));
    ASSERT_FALSE(f.ok()) << "length " << len;
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << f.status().ToString();
    EXPECT_NE(f.status().message().find("t.gguf"), std::string::npos);
  }
}

TEST(GgufErrors, UnknownArchitecture) {
  TempDir d;
  auto f = GgufFile::Open(d.Write("a.gguf", MakeGguf("mamba9", 64)));
  ASSERT_TRUE(f.ok());
  auto c = ConfigFromGguf(**f);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("mamba9"), std::string::npos);
}

TEST(GgufErrors, LoadModelReportsMissingMetadata) {
  TempDir d;
  auto m = LoadModel(d.Write("a.gguf", MakeGguf("llama", 64)), LoadOptions{false, false});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("embedding_length"), std::string::npos)
      << m.status().ToString();
}

std::string MakeSafetensors(const std::string& header, size_t data_bytes) {
  std::string s;
  Put<uint64_t>(s, header.size());
  s += header;
  s.append(data_bytes, '\0');
  return s;
}

TEST(SafetensorsErrors, MalformedHeader) {
  TempDir d;
  d.Write("model.safetensors", MakeSafetensors("{not json", 0));
  auto c = SafetensorsCheckpoint::OpenDir(d.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(c.status().message().find("model.safetensors"), std::string::npos);
}

TEST(SafetensorsErrors, TruncatedData) {
  TempDir d;
  d.Write("model.safetensors",
          MakeSafetensors(R"({"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]}})", 32));
  auto c = SafetensorsCheckpoint::OpenDir(d.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(c.status().message().find("truncated"), std::string::npos);
}

TEST(SafetensorsErrors, SizeMismatch) {
  TempDir d;
  d.Write("model.safetensors",
          MakeSafetensors(R"({"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,32]}})", 64));
  auto c = SafetensorsCheckpoint::OpenDir(d.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
}

TEST(SafetensorsErrors, ShardIndexNamesMissingFile) {
  TempDir d;
  d.Write("model.safetensors.index.json",
          R"({"weight_map":{"w":"model-00001-of-00002.safetensors"}})");
  auto c = SafetensorsCheckpoint::OpenDir(d.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("model-00001-of-00002.safetensors"), std::string::npos);
}

TEST(ConfigErrors, UnknownArchitecture) {
  auto c =
      ParseHfConfig(R"({"architectures":["FooForCausalLM"],"model_type":"foo"})", "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("FooForCausalLM"), std::string::npos);
}

TEST(ConfigErrors, InvalidValues) {
  auto c = ParseHfConfig(
      R"({"architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":64,"intermediate_size":128,
          "num_hidden_layers":2,"num_attention_heads":3,"num_key_value_heads":2})",
      "cfg/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("cfg/config.json"), std::string::npos);
}

TEST(ConfigErrors, NotJson) {
  auto c = ParseHfConfig("{", "x/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
}

TEST(LoaderErrors, MissingPath) {
  auto m = LoadModel("/no/such/model", LoadOptions{false, false});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
}

TEST(LoaderErrors, DirectoryWithoutConfig) {
  TempDir d;
  auto m = LoadModel(d.path(), LoadOptions{false, false});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("config.json"), std::string::npos);
}

}  // namespace
}  // namespace dinfer
