// Logging and invariant checks. Logging goes to stderr through spdlog (thread-safe).
// DINFER_CHECK is for programmer errors only; user-facing failures are Status values.
#pragma once

#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

namespace dinfer::log {

enum class Level { kDebug, kInfo, kWarn, kError, kOff };

void SetLevel(Level level);
// Accepts "debug", "info", "warn", "error", "off"; returns false on an unknown name.
bool SetLevel(std::string_view name);
bool Enabled(Level level);
void Write(Level level, std::string_view message);

template <typename... Args>
void Debug(fmt::format_string<Args...> f, Args&&... args) {
  if (Enabled(Level::kDebug)) Write(Level::kDebug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void Info(fmt::format_string<Args...> f, Args&&... args) {
  if (Enabled(Level::kInfo)) Write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void Warn(fmt::format_string<Args...> f, Args&&... args) {
  if (Enabled(Level::kWarn)) Write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void Error(fmt::format_string<Args...> f, Args&&... args) {
  if (Enabled(Level::kError)) Write(Level::kError, fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, std::string_view msg);

}  // namespace dinfer::log

#define DINFER_CHECK(cond)                                                  \
  do {                                                                      \
    if (!(cond)) ::dinfer::log::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define DINFER_CHECK_MSG(cond, ...)                                                               \
  do {                                                                                            \
    if (!(cond)) ::dinfer::log::CheckFailed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)
