#include "base/logging.h"

#include <atomic>
#include <cstdio>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace dinfer::log {
namespace {

std::atomic<Level> g_level{Level::kInfo};

spdlog::logger& Logger() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("dinfer");
    l->set_pattern("%^[%H:%M:%S.%e %L]%$ %v");
    l->set_level(spdlog::level::trace);
    return l;
  }();
  return *logger;
}

}  // namespace

void SetLevel(Level level) { g_level.store(level); }

bool SetLevel(std::string_view name) {
  if (name == "debug")
    SetLevel(Level::kDebug);
  else if (name == "info")
    SetLevel(Level::kInfo);
  else if (name == "warn")
    SetLevel(Level::kWarn);
  else if (name == "error")
    SetLevel(Level::kError);
  else if (name == "off")
    SetLevel(Level::kOff);
  else
    return false;
  return true;
}

bool Enabled(Level level) { return level >= g_level.load(std::memory_order_relaxed); }

void Write(Level level, std::string_view message) {
  switch (level) {
    case Level::kDebug:
      Logger().debug(message);
      break;
    case Level::kInfo:
      Logger().info(message);
      break;
    case Level::kWarn:
      Logger().warn(message);
      break;
    case Level::kError:
      Logger().error(message);
      break;
    case Level::kOff:
      break;
  }
}

void CheckFailed(const char* file, int line, const char* expr, std::string_view msg) {
  std::fprintf(stderr, "dinfer: check failed at %s:%d: %s %.*s\n", file, line, expr,
               static_cast<int>(msg.size()), msg.data());
  std::abort();
}

}  // namespace dinfer::log
