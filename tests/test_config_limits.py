"""Config sizes and relations are checked before anything is allocated: a size key no weight file
could back is refused naming the key, a context the machine cannot hold is refused before the KV
cache exists, and llama3 RoPE factors that would divide by zero are refused."""

from __future__ import annotations

import json

import pytest

from fuelcli.errors import ConfigError, FuelError, InputError
from fuelcli.model.config import from_hf_config
from fuelcli.model.sizes import check_engine_fits, engine_bytes

import malformed as M

SIZE_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim"]


@pytest.mark.parametrize("key", SIZE_KEYS)
def test_a_huge_size_is_refused_naming_the_key(tmp_path, key):
    d = M.write_hf_dir(tmp_path / "m")
    (d / "config.json").write_text(json.dumps({**M.CONFIG, key: 10 ** 12}))
    with pytest.raises(FuelError) as e:
        M.run_pipeline(d)
    text = str(e.value)
    assert "\n" not in text and str(d / "config.json") in text, text
    if key in ("num_attention_heads", "num_key_value_heads"):  # caught by a relation first
        assert "num_attention_heads=" in text, text
    else:
        assert f"{key}=1000000000000 is too large for the weights" in text, text


def test_sizes_are_checked_against_the_files_not_a_constant():
    """The same config passes with big enough files and fails with small ones: the bound is the
    files' size (at 4.5 bits per weight), so real models of any size pass."""
    raw = {**M.CONFIG, "hidden_size": 1 << 20, "num_attention_heads": 32, "num_key_value_heads": 32}
    assert from_hf_config(raw, file_bytes=10 ** 9).hidden_size == 1 << 20
    with pytest.raises(ConfigError, match="hidden_size=1048576 is too large"):
        from_hf_config(raw, file_bytes=2 << 20)  # hidden_size alone needs 9 MiB
    # a file merely too small for plausible sizes is left to the weight readers (they name the file)
    assert from_hf_config(M.CONFIG, file_bytes=14).hidden_size == M.H
    assert from_hf_config({**M.CONFIG, "hidden_size": 4096}, file_bytes=20_000).hidden_size == 4096


def test_gguf_keys_are_named_as_the_file_spells_them(tmp_path):
    p = tmp_path / "t.gguf"
    meta = [m if m[0] != "llama.block_count" else ("llama.block_count", M.U64, 1 << 63) for m in M.tiny_gguf_meta()]
    p.write_bytes(M.gguf_bytes(meta)[0])
    with pytest.raises(ConfigError, match=r"t\.gguf: llama\.block_count=9223372036854775808 is too large"):
        M.run_pipeline(p)


def test_layers_without_weight_files_are_held_to_memory(monkeypatch):
    import fuelcli.model.sizes as sizes

    monkeypatch.setattr(sizes, "available_bytes", lambda: 1 << 30)
    with pytest.raises(ConfigError, match="num_hidden_layers=1000000000000 is more layers than this machine"):
        from_hf_config({**M.CONFIG, "num_hidden_layers": 10 ** 12})
    with pytest.raises(ConfigError, match="head_dim=1000000000000 is more RoPE frequencies"):
        from_hf_config({**M.CONFIG, "head_dim": 10 ** 12})
    assert from_hf_config({**M.CONFIG, "num_hidden_layers": 80}).num_layers == 80


def test_a_context_beyond_memory_is_refused_before_allocating(monkeypatch):
    import fuelcli.model.sizes as sizes
    from fuelcli.backends.base import Engine

    cfg = from_hf_config({**M.CONFIG, "max_position_embeddings": 10 ** 12})
    kv, rest = engine_bytes(cfg, 10 ** 11)
    assert kv == 2 * 4 * 1 * 10 ** 11 * M.NH * M.HD  # layers × n_ctx × kv_dim, K and V, float32
    monkeypatch.setattr(sizes, "available_bytes", lambda: 1 << 30)

    class Probe(Engine):  # the base class checks before any backend allocates
        kv_bytes = 0

        def prefill(self, tokens, all_logits=False, hidden=False):
            raise AssertionError

    with pytest.raises(InputError, match="not enough memory for a context of 100000000000 tokens: the KV cache "
                                         "needs 5.8 TiB"):
        Probe(cfg, 10 ** 11)
    Probe(cfg, 1000)  # 64 KB of cache: fine
    check_engine_fits(cfg, 10 ** 6)
    monkeypatch.setattr(sizes, "available_bytes", lambda: None)  # no /proc/meminfo: no check
    check_engine_fits(cfg, 10 ** 11)


def test_cli_refuses_a_huge_context(tmp_path):
    """End to end: max_position_embeddings 10^12 and bench -d 10^11 (llama-bench's depth)."""
    from test_cli_defence import fuel, one_line_error

    d = M.write_hf_dir(tmp_path / "m", config={**M.CONFIG, "max_position_embeddings": 10 ** 12})
    one_line_error(fuel("bench", d, "-p", "0", "-n", "1", "-d", str(10 ** 11), "-r", "1", "--no-progress"), 2,
                   "not enough memory for a context of 100000000002 tokens", "-d")


@pytest.mark.parametrize("low, high, ok", [(0, 4, False), (1, 0, False), (-1, 4, False), (4, 1, False),
                                           (1, 1, True), (1, 4, True)])
def test_llama3_rope_factors(low, high, ok):
    import warnings

    from fuelcli.model.rope import inv_freq

    raw = {**M.CONFIG, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": low,
                                        "high_freq_factor": high, "original_max_position_embeddings": 32}}
    if not ok:
        with pytest.raises(ConfigError, match="needs 0 < low_freq_factor <= high_freq_factor"):
            from_hf_config(raw)
        return
    cfg = from_hf_config(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # equal factors used to print a numpy RuntimeWarning
        f = inv_freq(cfg.rope, 64)
    assert f.shape == (32,) and (f > 0).all()


def test_equal_factors_are_a_hard_cut_as_transformers_computes_it():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from fuelcli.model.rope import inv_freq

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0,
               "original_max_position_embeddings": 64}
    hf_cfg = LlamaConfig(hidden_size=128, num_attention_heads=2, rope_theta=500.0, rope_scaling=scaling)
    expect, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, torch.device("cpu"))
    cfg = from_hf_config({**M.CONFIG, "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
                          "rope_theta": 500.0, "rope_scaling": scaling})
    assert (inv_freq(cfg.rope, 64) == expect.numpy()).all()


def test_zero_and_huge_counts():
    with pytest.raises(ConfigError, match="max_position_embeddings must be > 0"):
        from_hf_config({**M.CONFIG, "max_position_embeddings": 0})
    with pytest.raises(ConfigError, match="bos_token_id=8 is outside the vocabulary"):
        from_hf_config({**M.CONFIG, "bos_token_id": 8})
    with pytest.raises(ConfigError, match="eos_token_id=99 is outside the vocabulary"):
        from_hf_config({**M.CONFIG, "eos_token_id": [2, 99]})
    with pytest.raises(ConfigError, match="eos_token_id=9 is outside"):
        from_hf_config(M.CONFIG, {"eos_token_id": 9})
