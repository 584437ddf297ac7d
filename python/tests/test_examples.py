"""The programs of examples/ run as a user runs them (a subprocess, tiny sizes, on the CPU's
reference backend here; on CUDA with `-m gpu` on the GPU machine) and finish without error: each
checks its own result (the GPT's loss falls; generation with fusedattn gives sdpa's tokens; the
paged KV cache's decode agrees with a dense recomputation at every step)."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")])]


def _run(name, *args):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize("device", DEVICES)
def test_train_gpt(device):
    stdout = _run("train_gpt.py", "--device", device, "--steps", "30", "--layers", "2",
                  "--dim", "64", "--seq", "32", "--batch", "4")
    assert "loss" in stdout


@pytest.mark.parametrize("device", DEVICES)
def test_hf_generate(device):
    pytest.importorskip("transformers", reason="transformers is not installed here")
    stdout = _run("hf_generate.py", "--device", device, "--dtype", "float32",
                  "--max-new-tokens", "8")
    assert "agree on 100.0% of the tokens" in stdout


@pytest.mark.parametrize("device", DEVICES)
def test_paged_decode(device):
    stdout = _run("paged_decode.py", "--device", device, "--new-tokens", "6")
    assert "every step agrees with the dense recomputation" in stdout


def test_hf_train_step_bench_runs_on_cpu(tmp_path):
    """bench/hf_train_step.py (the GPU machine's train-step comparison) end to end at tiny
    sizes: both implementations step, agree, and the results are written."""
    pytest.importorskip("transformers", reason="transformers is not installed here")
    bench = os.path.join(EXAMPLES, "..", "bench", "hf_train_step.py")
    out = subprocess.run(
        [sys.executable, bench, "--device", "cpu", "--dtype", "float32", "--steps", "1",
         "--warmup", "0", "--batch", "2", "--seq", "16", "--layers", "1", "--hidden", "32",
         "--heads", "4", "--kv-heads", "2", "--mlp", "48", "--vocab", "64", "--out",
         str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".md"]
    import json
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    for kind in ("full", "padded", "left-padded"):
        assert record["results"][kind]["logits_rel"] < 1e-4, kind
