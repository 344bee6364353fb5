"""Bad input gets one line on stderr naming the cause and a distinct exit code; never a traceback."""

import json
import os
import subprocess
import sys



def fuel(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fuelcli", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def one_line_error(r, code: int, *needles):
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_local_model(tmp_path):
    one_line_error(fuel("run", str(tmp_path / "nope"), "hi"), 2, "nope")


def test_uncached_hub_repo_offline(tmp_path):
    one_line_error(fuel("run", "someone/not-cached-model", "hi", env={"HF_HOME": str(tmp_path)}), 2,
                   "someone/not-cached-model")


def test_unknown_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "hidden_size": 8}))
    one_line_error(fuel("logits", str(tmp_path), "--tokens", "1", "--out", str(tmp_path / "o.npy")), 2,
                   "unsupported model_type 'gpt2'",
                   "llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, smollm3, gemma3_text")
    assert not (tmp_path / "o.npy").exists()


def test_broken_weights_file(tiny, tmp_path):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(tiny("llama2"), d)
    st = d / "model.safetensors"
    st.write_bytes(st.read_bytes()[:1000])
    one_line_error(fuel("logits", str(d), "--tokens", "1,2", "--out", str(tmp_path / "o.npy")), 2,
                   "model.safetensors")
    assert not (tmp_path / "o.npy").exists()


def test_bad_tokens_and_path(tiny, tmp_path):
    d = str(tiny("llama2"))
    one_line_error(fuel("logits", d, "--tokens", "1,x", "--out", str(tmp_path / "o.npy")), 2, "--tokens")
    one_line_error(fuel("logits", d, "--tokens", "1,99999", "--out", str(tmp_path / "o.npy")), 2, "99999")
    one_line_error(fuel("logits", d, "--tokens", "1", "--path", "fast", "--out", str(tmp_path / "o.npy")), 2,
                   "--path")


def test_logits_paths_agree(tiny, tmp_path):
    import numpy as np

    d = str(tiny("qwen2_window"))
    out = {}
    for path in ("decode", "prefill", "reference"):
        r = fuel("logits", d, "--tokens", ",".join(str(i) for i in range(3, 23)), "--path", path,
                 "--out", str(tmp_path / f"{path}.npy"))
        assert r.returncode == 0, r.stderr
        out[path] = np.load(tmp_path / f"{path}.npy")
        assert out[path].shape == (20, 256) and out[path].dtype == np.float32
    # same tolerance as the transformers comparison (tests/test_decoder_oracle.py)
    assert np.abs(out["decode"] - out["reference"]).max() <= 2e-4
    assert np.abs(out["prefill"] - out["reference"]).max() <= 2e-4


def test_cold_kernel_cache_is_detected(tmp_path):
    """`fuel run` warns before a first-run compile; the check reads numba's cache index."""
    r = subprocess.run([sys.executable, "-c", "from fuelcli.backends.cpu.engine import kernels_cached; print(kernels_cached())"],
                       capture_output=True, text=True, env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)})
    assert r.stdout.strip() == "False", r.stderr


def test_cache_type(tiny, tmp_path):
    """--cache-type: f32 or f16 on the CPU; anything else, or f16 on cuda, is one line and exit 2,
    and no output file. An f16 cache gives logits close to the f32 cache's, not the same ones."""
    d, out = str(tiny("llama2")), tmp_path / "o.npy"
    args = ["logits", d, "--tokens", "1,2,3,4", "--path", "decode", "--out", str(out)]
    one_line_error(fuel(*args, "--cache-type", "q8"), 2, "'q8'", "--cache-type", "f32, f16")
    one_line_error(fuel(*args, "--cache-type", "f16", "--device", "cuda"), 2, "--cache-type f16", "cuda")
    assert not out.exists()
    import numpy as np

    assert fuel(*args, "--cache-type", "f16").returncode == 0
    f16 = np.load(out)
    assert fuel(*args).returncode == 0
    f32 = np.load(out)
    assert not np.array_equal(f16, f32) and np.abs(f16 - f32).max() < 0.05  # measured 0.012, logits ~4
