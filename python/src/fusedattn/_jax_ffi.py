"""The XLA FFI handlers of fusedattn.jax (python/src/jax_ffi.cpp): found or built, loaded, and
registered with JAX as the targets fusedattn_fwd_v1 and fusedattn_bwd_v1 for the platforms
"cpu" and "CUDA".

The handler library is a plain shared library over the C API that includes only jaxlib's
header-only FFI, so it is built with the package when jaxlib is importable at build time
(`pip install --no-build-isolation .` where jax is installed; CMake's FUSEDATTN_JAX) and runs
under that jaxlib or a newer one (the FFI's C API is versioned and newer XLA accepts older
handlers). Otherwise it is compiled here on first use, once per source, jaxlib and package
location, into the user's cache directory with the C++ compiler ($CXX, else c++): a few seconds.
"""

import ctypes
import hashlib
import os
import subprocess
import tempfile
import warnings

import jax
import jaxlib

from . import _C
from ._cache import cache_root

FWD_TARGET = "fusedattn_fwd_v1"
BWD_TARGET = "fusedattn_bwd_v1"

_HERE = os.path.dirname(os.path.abspath(__file__))
# Not a Python module name: an importable name would shadow this file.
_LIBRARY = "libfusedattn_jax_ffi.so"


def _version_tuple(text):
    out = []
    for part in text.split("."):
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def _prebuilt():
    """The handler library built with the package, when the running jaxlib is the one it was
    built against or newer."""
    path = os.path.join(_HERE, _LIBRARY)
    stamp = os.path.join(_HERE, "libfusedattn_jax_ffi.jaxlib_version")
    if not (os.path.exists(path) and os.path.exists(stamp)):
        return None, "not built with the package (jaxlib was not importable at build time)"
    with open(stamp) as f:
        built_for = f.read().strip()
    if _version_tuple(jaxlib.__version__) < _version_tuple(built_for):
        return None, "built for jaxlib %s, newer than the running jaxlib %s" % (
            built_for, jaxlib.__version__)
    return path, None


def _compile(why):
    """Compiles _csrc/jax_ffi.cpp against this jaxlib's FFI headers and the package's
    libfusedattn into the cache directory (written atomically: concurrent first uses are safe)."""
    source = os.path.join(_HERE, "_csrc", "jax_ffi.cpp")
    header = os.path.join(_HERE, "_csrc", "layout_axes.h")  # the one it includes from _csrc/
    library = [f for f in sorted(os.listdir(_HERE)) if f.startswith("libfusedattn.so")]
    if not (os.path.exists(source) and os.path.exists(header)) or not library:
        raise ImportError("fusedattn.jax's XLA FFI handlers are %s, and their source is not in "
                          "the package to compile them: reinstall fusedattn with "
                          "`pip install --no-build-isolation .` where jax is installed" % why)
    key = hashlib.sha256()
    for path in (source, header):
        with open(path, "rb") as f:
            key.update(f.read())
    key.update(jaxlib.__version__.encode() + _HERE.encode())
    tag = "%s-jaxlib%s-%s" % (_C.version(), jaxlib.__version__, key.hexdigest()[:16])
    folder = os.path.join(cache_root(), "jax_ffi", tag)
    path = os.path.join(folder, _LIBRARY)
    if os.path.exists(path):
        return path
    os.makedirs(folder, exist_ok=True)
    compiler = os.environ.get("CXX", "c++")
    warnings.warn("fusedattn: the JAX FFI handlers are %s; compiling them once for jaxlib %s "
                  "into %s (a few seconds)" % (why, jaxlib.__version__, folder))
    fd, temporary = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    command = [compiler, "-std=c++17", "-O2", "-fPIC", "-shared",
               "-isystem", jax.ffi.include_dir(), "-I", os.path.join(_HERE, "_csrc"),
               source, "-o", temporary, os.path.join(_HERE, library[0]),
               "-Wl,-rpath," + _HERE]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as error:
        os.unlink(temporary)
        raise ImportError("fusedattn.jax's XLA FFI handlers are %s, and the C++ compiler %r "
                          "could not run (%s): install one (or set CXX), or reinstall fusedattn "
                          "with `pip install --no-build-isolation .` where jax is installed"
                          % (why, compiler, error)) from error
    if result.returncode != 0:
        os.unlink(temporary)
        raise ImportError("fusedattn.jax's XLA FFI handlers are %s, and compiling them failed:\n"
                          "%s\n%s" % (why, " ".join(command), result.stderr[-4000:]))
    os.replace(temporary, path)
    return path


def _load():
    path, why = _prebuilt()
    if path is None:
        path = _compile(why)
    return ctypes.CDLL(path)


_HANDLERS = _load()

for _name, _symbol, _platform in ((FWD_TARGET, "fusedattn_xla_fwd_cpu", "cpu"),
                                  (BWD_TARGET, "fusedattn_xla_bwd_cpu", "cpu"),
                                  (FWD_TARGET, "fusedattn_xla_fwd_cuda", "CUDA"),
                                  (BWD_TARGET, "fusedattn_xla_bwd_cuda", "CUDA")):
    jax.ffi.register_ffi_target(_name, jax.ffi.pycapsule(getattr(_HANDLERS, _symbol)),
                                platform=_platform)

_HANDLERS.fusedattn_xla_graph_cache_size.restype = ctypes.c_int64


def graph_cache_size():
    """How many score_mod graphs the handlers keep (equal expressions share one)."""
    return int(_HANDLERS.fusedattn_xla_graph_cache_size())


del _name, _symbol, _platform
