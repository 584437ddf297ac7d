"""Exceptions raised for the library's statuses. Every one carries the C library's message."""

# fusedattn_status codes (include/fusedattn/fusedattn.h).
SUCCESS = 0
INVALID_ARGUMENT = 1
NOT_SUPPORTED = 2
WORKSPACE = 3
CUDA = 4
CUDNN = 5
OUT_OF_MEMORY = 6
INTERNAL = 7

_STATUS_NAMES = {
    INVALID_ARGUMENT: "invalid argument",
    NOT_SUPPORTED: "not supported",
    WORKSPACE: "workspace too small",
    CUDA: "CUDA error",
    CUDNN: "cuDNN error",
    OUT_OF_MEMORY: "out of memory",
    INTERNAL: "internal error",
}


class Error(RuntimeError):
    """A fusedattn call failed. str(error) is the library's message; .status is the
    fusedattn_status code and .status_name its name."""

    def __init__(self, message, status=INTERNAL):
        super().__init__(message)
        self.status = status
        self.status_name = _STATUS_NAMES.get(status, "status %d" % status)


class InvalidArgumentError(Error, ValueError):
    """The config or a tensor is wrong (FUSEDATTN_ERROR_INVALID_ARGUMENT)."""

    def __init__(self, message, status=INVALID_ARGUMENT):
        super().__init__(message, status)


class NotSupportedError(Error):
    """Valid, but no backend (or not the forced one) runs it (FUSEDATTN_ERROR_NOT_SUPPORTED)."""

    def __init__(self, message, status=NOT_SUPPORTED):
        super().__init__(message, status)


class OutOfMemoryError(Error, MemoryError):
    """FUSEDATTN_ERROR_OUT_OF_MEMORY."""

    def __init__(self, message, status=OUT_OF_MEMORY):
        super().__init__(message, status)


_CLASSES = {
    INVALID_ARGUMENT: InvalidArgumentError,
    NOT_SUPPORTED: NotSupportedError,
    OUT_OF_MEMORY: OutOfMemoryError,
}


def error_class(status):
    """The exception class for a fusedattn_status (used by the extension module)."""
    return _CLASSES.get(status, Error)
