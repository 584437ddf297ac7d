"""Where fusedattn keeps what it builds on first use (the PyTorch operators, the JAX FFI handlers):
one cache directory, chosen by the same environment variables as the library's kernel cache."""

import os


def cache_root():
    """FUSEDATTN_CACHE_DIR, else $XDG_CACHE_HOME/fusedattn, else ~/.cache/fusedattn."""
    explicit = os.environ.get("FUSEDATTN_CACHE_DIR", "")
    if explicit and explicit.lower() not in ("0", "off", "none"):
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fusedattn")
