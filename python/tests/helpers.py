"""Helpers shared by the tests."""

import numpy as np

# ||out - ref|| / ||ref|| bounds of the house (DESIGN.md), by dtype.
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def relative_error(out, ref):
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    denominator = np.linalg.norm(ref)
    if denominator == 0:
        return float(np.linalg.norm(out))
    return float(np.linalg.norm(out - ref) / denominator)


def numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
