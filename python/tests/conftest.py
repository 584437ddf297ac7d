"""Tests marked `gpu` (registered here and in pyproject.toml) need PyTorch and, most of them, a
CUDA device: they run on the GPU machine and skip elsewhere, saying why. Everything else runs on a
CPU-only build machine with NumPy against the reference backend."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs PyTorch and a CUDA device (the GPU machine); skipped otherwise")
