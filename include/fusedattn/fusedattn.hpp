// A thin C++ layer over the C API: exceptions instead of statuses, a config builder, and owning
// nothing the C API does not own. The C API (fusedattn.h) stays the one source of truth.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "fusedattn/fusedattn.h"

namespace fusedattn {

class Error : public std::runtime_error {
 public:
  Error(fusedattn_status status, const std::string& message)
      : std::runtime_error(std::string(fusedattn_status_string(status)) + ": " + message),
        status_(status) {}
  fusedattn_status status() const { return status_; }

 private:
  fusedattn_status status_;
};

namespace detail {
inline constexpr size_t kMessageBytes = 4096;
inline void Check(fusedattn_status status, const char* message) {
  if (status != FUSEDATTN_SUCCESS) throw Error(status, message);
}
}  // namespace detail

// A config initialized with FUSEDATTN_CONFIG_INIT.
inline fusedattn_config DefaultConfig() {
  fusedattn_config c = FUSEDATTN_CONFIG_INIT;
  return c;
}

struct Selection {
  fusedattn_backend backend;
  std::string diagnostic;
};

// The backend that runs `config`, with the diagnostic; throws Error naming every refusal.
inline Selection GetBackend(const fusedattn_config& config) {
  char msg[detail::kMessageBytes];
  fusedattn_backend backend = FUSEDATTN_BACKEND_AUTO;
  detail::Check(fusedattn_get_backend(&config, &backend, msg, sizeof msg), msg);
  return {backend, msg};
}

inline size_t FwdWorkspaceSize(const fusedattn_config& config) {
  char msg[detail::kMessageBytes];
  size_t bytes = 0;
  detail::Check(fusedattn_fwd_workspace_size(&config, &bytes, msg, sizeof msg), msg);
  return bytes;
}

inline size_t BwdWorkspaceSize(const fusedattn_config& config) {
  char msg[detail::kMessageBytes];
  size_t bytes = 0;
  detail::Check(fusedattn_bwd_workspace_size(&config, &bytes, msg, sizeof msg), msg);
  return bytes;
}

inline void Forward(const fusedattn_config& config, const fusedattn_fwd_args& args,
                    void* workspace = nullptr, size_t workspace_bytes = 0,
                    void* stream = nullptr) {
  char msg[detail::kMessageBytes];
  detail::Check(
      fusedattn_fwd(&config, &args, workspace, workspace_bytes, stream, msg, sizeof msg), msg);
}

inline void Backward(const fusedattn_config& config, const fusedattn_bwd_args& args,
                     void* workspace = nullptr, size_t workspace_bytes = 0,
                     void* stream = nullptr) {
  char msg[detail::kMessageBytes];
  detail::Check(
      fusedattn_bwd(&config, &args, workspace, workspace_bytes, stream, msg, sizeof msg), msg);
}

namespace detail {
// fusedattn_tensor holds FUSEDATTN_MAX_DIMS dimensions: a longer shape is refused, never written
// past the arrays.
inline void CheckDims(const char* function, size_t shape_dims, size_t stride_dims,
                      bool has_strides) {
  if (shape_dims > FUSEDATTN_MAX_DIMS)
    throw Error(FUSEDATTN_ERROR_INVALID_ARGUMENT,
                std::string(function) + ": a shape of " + std::to_string(shape_dims) +
                    " dimensions; a fusedattn_tensor has at most " +
                    std::to_string(FUSEDATTN_MAX_DIMS) + " (FUSEDATTN_MAX_DIMS)");
  if (has_strides && stride_dims != shape_dims)
    throw Error(FUSEDATTN_ERROR_INVALID_ARGUMENT,
                std::string(function) + ": " + std::to_string(shape_dims) +
                    " dimensions in the shape but " + std::to_string(stride_dims) +
                    " strides");
}
}  // namespace detail

// A tensor descriptor from a pointer, dtype, shape and strides (in elements). Throws Error
// (FUSEDATTN_ERROR_INVALID_ARGUMENT) for more than FUSEDATTN_MAX_DIMS dimensions or a stride
// count that differs from the shape's.
inline fusedattn_tensor MakeTensor(void* data, fusedattn_dtype dtype,
                                   std::initializer_list<int64_t> shape,
                                   std::initializer_list<int64_t> strides) {
  detail::CheckDims("fusedattn::MakeTensor", shape.size(), strides.size(), true);
  fusedattn_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  i = 0;
  for (int64_t s : strides) t.strides[i++] = s;
  return t;
}

// Row-major strides for a shape. Throws Error for more than FUSEDATTN_MAX_DIMS dimensions.
inline fusedattn_tensor MakeContiguousTensor(void* data, fusedattn_dtype dtype,
                                             std::initializer_list<int64_t> shape) {
  detail::CheckDims("fusedattn::MakeContiguousTensor", shape.size(), 0, false);
  fusedattn_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

}  // namespace fusedattn
