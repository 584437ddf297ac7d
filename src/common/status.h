// Status: a code and a readable message. Every internal step returns one; the C API copies the
// message into the caller's buffer.
#pragma once

#include <cstdio>
#include <string>
#include <utility>

#include "fusedattn/fusedattn.h"

namespace fusedattn {

class Status {
 public:
  Status() = default;
  Status(fusedattn_status code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == FUSEDATTN_SUCCESS; }
  fusedattn_status code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  fusedattn_status code_ = FUSEDATTN_SUCCESS;
  std::string message_;
};

// printf-style message builder.
template <typename... Args>
std::string Format(const char* fmt, Args... args) {
  int n = std::snprintf(nullptr, 0, fmt, args...);
  if (n <= 0) return {};
  std::string s(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(s.data(), s.size(), fmt, args...);
  s.resize(static_cast<size_t>(n));
  return s;
}
inline std::string Format(const char* fmt) { return fmt; }

template <typename... Args>
Status InvalidArgument(const char* fmt, Args... args) {
  return {FUSEDATTN_ERROR_INVALID_ARGUMENT, Format(fmt, args...)};
}
template <typename... Args>
Status NotSupported(const char* fmt, Args... args) {
  return {FUSEDATTN_ERROR_NOT_SUPPORTED, Format(fmt, args...)};
}
template <typename... Args>
Status InternalError(const char* fmt, Args... args) {
  return {FUSEDATTN_ERROR_INTERNAL, Format(fmt, args...)};
}

#define FUSEDATTN_RETURN_IF_ERROR(expr)          \
  do {                                           \
    ::fusedattn::Status status_ = (expr);        \
    if (!status_.ok()) return status_;           \
  } while (0)

}  // namespace fusedattn
