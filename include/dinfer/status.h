// Status and StatusOr<T>: errors as values across module boundaries.
// Every error carries a stable code (StatusCode) and a message a user can act on.
// Value types; no shared state, safe to use from any thread.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace dinfer {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kDataLoss,       // truncated or malformed file
  kUnimplemented,  // a known feature we do not support (dtype, architecture)
  kOutOfRange,
  kResourceExhausted,
  kFailedPrecondition,
  kInternal,
  kIo,
  kCancelled,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "NOT_FOUND: cannot open 'x.gguf': No such file or directory"
  std::string ToString() const;
  // Prepends context ("loading model: ") to the message, keeping the code.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }

template <typename... Args>
Status MakeError(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status InvalidArgument(fmt::format_string<Args...> f, Args&&... args) {
  return MakeError(StatusCode::kInvalidArgument, f, std::forward<Args>(args)...);
}
template <typename... Args>
Status NotFound(fmt::format_string<Args...> f, Args&&... args) {
  return MakeError(StatusCode::kNotFound, f, std::forward<Args>(args)...);
}
template <typename... Args>
Status DataLoss(fmt::format_string<Args...> f, Args&&... args) {
  return MakeError(StatusCode::kDataLoss, f, std::forward<Args>(args)...);
}
template <typename... Args>
Status Unimplemented(fmt::format_string<Args...> f, Args&&... args) {
  return MakeError(StatusCode::kUnimplemented, f, std::forward<Args>(args)...);
}
template <typename... Args>
Status Internal(fmt::format_string<Args...> f, Args&&... args) {
  return MakeError(StatusCode::kInternal, f, std::forward<Args>(args)...);
}
template <typename... Args>
Status IoError(fmt::format_string<Args...> f, Args&&... args) {
  return MakeError(StatusCode::kIo, f, std::forward<Args>(args)...);
}

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).ok()); }
  StatusOr(T value) : v_(std::move(value)) {}

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace dinfer

#define DINFER_CONCAT_INNER_(a, b) a##b
#define DINFER_CONCAT_(a, b) DINFER_CONCAT_INNER_(a, b)

#define DINFER_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::dinfer::Status dinfer_status_ = (expr);        \
    if (!dinfer_status_.ok()) return dinfer_status_; \
  } while (0)

#define DINFER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

#define DINFER_ASSIGN_OR_RETURN(lhs, expr) \
  DINFER_ASSIGN_OR_RETURN_IMPL_(DINFER_CONCAT_(dinfer_statusor_, __LINE__), lhs, expr)
