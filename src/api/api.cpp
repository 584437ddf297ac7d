// The C entry points: argument checking, error text, dispatch to the selected backend (select.h:
// RunForward / RunBackward, which also retry the next backend when the chosen one cannot run the
// call's tensors).
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "common/cuda_util.h"
#ifdef FUSEDATTN_WITH_CUDNN
#include <cudnn.h>
#endif
#include "fusedattn/fusedattn.h"
#include "problem/problem.h"
#include "select/select.h"

using namespace fusedattn;

namespace {

// Copies a message into the caller's buffer, NUL-terminated and truncated to fit.
void WriteMessage(char* msg, size_t msg_len, const std::string& text) {
  if (msg == nullptr || msg_len == 0) return;
  size_t n = text.size() < msg_len - 1 ? text.size() : msg_len - 1;
  std::memcpy(msg, text.data(), n);
  msg[n] = '\0';
}

fusedattn_status Finish(const Status& status, char* msg, size_t msg_len) {
  WriteMessage(msg, msg_len, status.message());
  return status.code();
}

// Runs body, turning exceptions into statuses: no exception crosses the C boundary.
template <typename Body>
fusedattn_status Guarded(char* msg, size_t msg_len, Body&& body) {
  try {
    return Finish(body(), msg, msg_len);
  } catch (const std::bad_alloc&) {
    return Finish(Status(FUSEDATTN_ERROR_OUT_OF_MEMORY, "out of host memory"), msg, msg_len);
  } catch (const std::exception& e) {
    return Finish(InternalError("internal error: %s", e.what()), msg, msg_len);
  } catch (...) {
    return Finish(InternalError("internal error: unknown exception"), msg, msg_len);
  }
}

// Replaces the tensors' dropout seed and offset by the {seed, offset} the caller holds in memory
// (args.dropout_seed_offset), when dropout is on. On CUDA this is a 16-byte copy that waits for
// the stream: the kernels take the seed and offset as host values.
template <typename Tensors>
Status ReadDropoutSeedOffset(const Problem& problem, void* stream, Tensors* tensors) {
  if (tensors->dropout_seed_offset == nullptr || !problem.has_dropout()) return Status::Ok();
  uint64_t seed_offset[2];
  if (problem.device == Device::kCuda) {
    FUSEDATTN_RETURN_IF_ERROR(
        CopyToHost(seed_offset, tensors->dropout_seed_offset, sizeof seed_offset, stream));
  } else {
    std::memcpy(seed_offset, tensors->dropout_seed_offset, sizeof seed_offset);
  }
  tensors->dropout_seed = seed_offset[0];
  tensors->dropout_offset = seed_offset[1];
  return Status::Ok();
}

// FUSEDATTN_FP8_CHECK_SCALES=0: CUDA calls do not read the FP8 scaling factors on the host.
bool CheckDeviceFp8Scales() {
  static const bool check = [] {
    const char* value = std::getenv("FUSEDATTN_FP8_CHECK_SCALES");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return check;
}

// The FP8 scaling factors of a call must be finite and > 0 (fusedattn.h, "FP8 attention"). They
// are read on the host: directly for CPU tensors, by copies that wait for the stream for CUDA
// ones (unless FUSEDATTN_FP8_CHECK_SCALES=0). Nothing has been written when this refuses.
template <typename Scales>
Status CheckFp8Scales(const Problem& problem, void* stream, const Scales& scales) {
  if (!problem.fp8) return Status::Ok();
  if (problem.device == Device::kCuda && !CheckDeviceFp8Scales()) return Status::Ok();
  const std::vector<NamedScale> read = Fp8ScalesRead(scales);
  std::vector<float> values(read.size());
  for (size_t k = 0; k < read.size(); ++k) {
    if (problem.device == Device::kCuda) {
      FUSEDATTN_RETURN_IF_ERROR(CopyToHost(&values[k], read[k].pointer, sizeof(float), stream));
    } else {
      values[k] = *read[k].pointer;
    }
  }
  return CheckFp8ScaleValues(read, values.data());
}

Status Prepare(const fusedattn_config* config, bool need_backward, Problem* problem,
               Backend** backend, std::string* diagnostic) {
  FUSEDATTN_RETURN_IF_ERROR(MakeProblem(config, HasCudaDevice(), problem));
  return SelectBackend(*problem, need_backward, backend, diagnostic);
}

}  // namespace

extern "C" {

fusedattn_fwd_args fusedattn_fwd_args_init(void) {
  fusedattn_fwd_args args;
  std::memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  return args;
}

fusedattn_bwd_args fusedattn_bwd_args_init(void) {
  fusedattn_bwd_args args;
  std::memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  return args;
}

fusedattn_status fusedattn_get_backend(const fusedattn_config* config, fusedattn_backend* backend,
                                       char* msg, size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    if (backend == nullptr) return InvalidArgument("backend (the output pointer) is NULL");
    Problem problem;
    Backend* chosen = nullptr;
    std::string diagnostic;
    Status s = Prepare(config, false, &problem, &chosen, &diagnostic);
    if (!s.ok()) return s;
    *backend = chosen->id();
    return Status(FUSEDATTN_SUCCESS, diagnostic);
  });
}

fusedattn_status fusedattn_fwd_workspace_size(const fusedattn_config* config, size_t* bytes,
                                              char* msg, size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    if (bytes == nullptr) return InvalidArgument("bytes (the output pointer) is NULL");
    Problem problem;
    FUSEDATTN_RETURN_IF_ERROR(MakeProblem(config, HasCudaDevice(), &problem));
    Backend* chosen = nullptr;
    return SelectBackendAndWorkspace(problem, false, &chosen, bytes);
  });
}

fusedattn_status fusedattn_bwd_workspace_size(const fusedattn_config* config, size_t* bytes,
                                              char* msg, size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    if (bytes == nullptr) return InvalidArgument("bytes (the output pointer) is NULL");
    Problem problem;
    FUSEDATTN_RETURN_IF_ERROR(MakeProblem(config, HasCudaDevice(), &problem));
    FUSEDATTN_RETURN_IF_ERROR(CheckHasBackward(problem));
    Backend* chosen = nullptr;
    return SelectBackendAndWorkspace(problem, true, &chosen, bytes);
  });
}

fusedattn_status fusedattn_fwd(const fusedattn_config* config, const fusedattn_fwd_args* args,
                               void* workspace, size_t workspace_bytes, void* stream, char* msg,
                               size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    Problem problem;
    FUSEDATTN_RETURN_IF_ERROR(MakeProblem(config, HasCudaDevice(), &problem));
    FwdTensors tensors;
    FUSEDATTN_RETURN_IF_ERROR(MakeFwdTensors(problem, args, &tensors));
    FUSEDATTN_RETURN_IF_ERROR(ReadDropoutSeedOffset(problem, stream, &tensors));
    FUSEDATTN_RETURN_IF_ERROR(CheckFp8Scales(problem, stream, tensors.fp8));
    return RunForward(problem, tensors, workspace, workspace_bytes, stream);
  });
}

fusedattn_status fusedattn_bwd(const fusedattn_config* config, const fusedattn_bwd_args* args,
                               void* workspace, size_t workspace_bytes, void* stream, char* msg,
                               size_t msg_len) {
  return Guarded(msg, msg_len, [&]() -> Status {
    Problem problem;
    FUSEDATTN_RETURN_IF_ERROR(MakeProblem(config, HasCudaDevice(), &problem));
    BwdTensors tensors;
    FUSEDATTN_RETURN_IF_ERROR(MakeBwdTensors(problem, args, &tensors));
    FUSEDATTN_RETURN_IF_ERROR(ReadDropoutSeedOffset(problem, stream, &tensors));
    FUSEDATTN_RETURN_IF_ERROR(CheckFp8Scales(problem, stream, tensors.fp8));
    return RunBackward(problem, tensors, workspace, workspace_bytes, stream);
  });
}

const char* fusedattn_status_string(fusedattn_status status) {
  switch (status) {
    case FUSEDATTN_SUCCESS: return "success";
    case FUSEDATTN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FUSEDATTN_ERROR_NOT_SUPPORTED: return "not supported";
    case FUSEDATTN_ERROR_WORKSPACE: return "workspace too small";
    case FUSEDATTN_ERROR_CUDA: return "CUDA error";
    case FUSEDATTN_ERROR_CUDNN: return "cuDNN error";
    case FUSEDATTN_ERROR_OUT_OF_MEMORY: return "out of memory";
    case FUSEDATTN_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* fusedattn_backend_name(fusedattn_backend backend) {
  switch (backend) {
    case FUSEDATTN_BACKEND_AUTO: return "auto";
    case FUSEDATTN_BACKEND_REFERENCE: return "reference";
    case FUSEDATTN_BACKEND_CUDNN: return "cudnn";
    case FUSEDATTN_BACKEND_FLASH: return "flash";
    case FUSEDATTN_BACKEND_SMALL_SEQ: return "small_seq";
  }
  return "unknown";
}

fusedattn_status fusedattn_backend_from_name(const char* name, fusedattn_backend* backend) {
  if (name == nullptr || backend == nullptr) return FUSEDATTN_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < FUSEDATTN_BACKEND_COUNT; ++i) {
    auto id = static_cast<fusedattn_backend>(i);
    if (std::strcmp(name, fusedattn_backend_name(id)) == 0) {
      *backend = id;
      return FUSEDATTN_SUCCESS;
    }
  }
  return FUSEDATTN_ERROR_INVALID_ARGUMENT;
}

int fusedattn_backend_available(fusedattn_backend backend, char* msg, size_t msg_len) {
  try {
    if (backend == FUSEDATTN_BACKEND_AUTO) {
      WriteMessage(msg, msg_len, "auto picks among the available backends");
      return 1;
    }
    Backend* b = FindBackend(backend);
    if (b == nullptr) {
      WriteMessage(msg, msg_len, Format("%d is not a fusedattn_backend", static_cast<int>(backend)));
      return 0;
    }
    Status s = b->available();
    WriteMessage(msg, msg_len, s.ok() ? "available" : s.message());
    return s.ok() ? 1 : 0;
  } catch (...) {
    WriteMessage(msg, msg_len, "internal error");
    return 0;
  }
}

int fusedattn_version(void) { return FUSEDATTN_VERSION; }

const char* fusedattn_version_string(void) {
#define FUSEDATTN_STR2(x) #x
#define FUSEDATTN_STR(x) FUSEDATTN_STR2(x)
  return FUSEDATTN_STR(FUSEDATTN_VERSION_MAJOR) "." FUSEDATTN_STR(
      FUSEDATTN_VERSION_MINOR) "." FUSEDATTN_STR(FUSEDATTN_VERSION_PATCH);
}

int64_t fusedattn_cudnn_version(void) {
#ifdef FUSEDATTN_WITH_CUDNN
  return static_cast<int64_t>(cudnnGetVersion());
#else
  return 0;
#endif
}

fusedattn_status fusedattn_get_cache_stats(fusedattn_backend backend,
                                           fusedattn_cache_stats* stats) {
  if (stats == nullptr) return FUSEDATTN_ERROR_INVALID_ARGUMENT;
  Backend* b = FindBackend(backend);
  if (b == nullptr) return FUSEDATTN_ERROR_INVALID_ARGUMENT;
  *stats = b->cache_stats();
  return FUSEDATTN_SUCCESS;
}

}  // extern "C"
