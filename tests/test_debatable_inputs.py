"""The debatable inputs of issue 9, each decided once (docs/bad-input.md, "Debatable inputs") and tested here.

refused: an unknown extra tensor, model_type disagreeing with architectures, a duplicate GGUF key,
         a GGUF tensor count lower than the tensors written, a BOS/EOS id beyond the vocabulary,
         --temp inf (and every non-finite sampling option).
         tie_word_embeddings true with a stored lm_head of other values (transformers keeps the
         stored head, vLLM and mlx-lm the embedding: the file is ambiguous).
accepted: tie_word_embeddings true with a stored lm_head equal to the embedding (one copy);
         Arabic-Indic digits in --tokens (Python's int(), as every integer option of the CLI).
"""

from __future__ import annotations


import numpy as np
import pytest

from fuelcli.errors import ConfigError, InputError
from fuelcli.model.config import from_hf_config
from fuelcli.assembly.reference import forward
from fuelcli.assembly.loader import open_model
from fuelcli.weights.gguf import read_gguf

import malformed as M


def test_an_unknown_extra_tensor_is_refused(tmp_path):
    t = M.hf_tensors()
    t["model.layers.0.self_attn.o_proj.bias"] = np.ones(M.H, np.float32)  # a bias the config does not announce
    m = open_model(str(M.write_hf_dir(tmp_path / "m", t)))
    with pytest.raises(InputError, match=r"tensor model\.layers\.0\.self_attn\.o_proj\.bias is not a weight of a "
                                         r"llama model with this config; fuel refuses rather than ignore it"):
        m.weights


def test_an_unknown_extra_gguf_tensor_is_refused(tmp_path):
    p = tmp_path / "t.gguf"
    p.write_bytes(M.gguf_bytes(tensors=M.tiny_gguf_tensors() + [("blk.0.attn_q_norm.weight",
                                                                 np.ones(4, np.float32))])[0])
    with pytest.raises(InputError, match=r"tensor blk\.0\.attn_q_norm\.weight is not a weight"):
        open_model(str(p)).weights


def test_buffers_no_model_reads_are_ignored(tmp_path):
    """RoPE inv_freq buffers of older Llama checkpoints and int buffers are not weights."""
    t = M.hf_tensors()
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(2, np.float32)
    d = M.write_hf_dir(tmp_path / "m", t)
    assert len(open_model(str(d)).weights.layers) == 1


def test_tied_embeddings_with_a_stored_lm_head(tmp_path):
    """The same bytes: tied (one copy). Different bytes: refused, the peers disagree on the meaning."""
    t = M.hf_tensors()
    tied_cfg = {**M.CONFIG, "tie_word_embeddings": True}
    with pytest.raises(InputError, match=r"tie_word_embeddings is true but the file stores a lm_head\.weight that "
                                         r"differs from model\.embed_tokens\.weight"):
        open_model(str(M.write_hf_dir(tmp_path / "a", t, config=tied_cfg))).weights
    same = {**t, "lm_head.weight": t["model.embed_tokens.weight"].copy()}
    m = open_model(str(M.write_hf_dir(tmp_path / "b", same, config=tied_cfg)))
    assert m.weights.output is m.weights.embed
    without = {k: v for k, v in t.items() if k != "lm_head.weight"}
    no_head = open_model(str(M.write_hf_dir(tmp_path / "c", without, config=tied_cfg)))
    assert np.array_equal(forward(m.cfg, m.weights, [1, 2, 3]), forward(no_head.cfg, no_head.weights, [1, 2, 3]))


def test_transformers_reads_a_differing_stored_head_its_own_way(tmp_path):
    """Why refusing: on the same directory transformers keeps the stored lm_head (untied), which
    is not what tie_word_embeddings says and not what vLLM or mlx-lm compute."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    t = M.hf_tensors()
    d = M.write_hf_dir(tmp_path / "m", t, config={**M.CONFIG, "tie_word_embeddings": True})
    hf = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32, attn_implementation="eager")
    with torch.inference_mode():
        got = hf(input_ids=torch.tensor([[1, 2, 3]])).logits[0].numpy()
    untied = open_model(str(M.write_hf_dir(tmp_path / "u", t)))
    tied = open_model(str(M.write_hf_dir(tmp_path / "t", {k: v for k, v in t.items() if k != "lm_head.weight"},
                                         config={**M.CONFIG, "tie_word_embeddings": True})))
    assert np.abs(forward(untied.cfg, untied.weights, [1, 2, 3]) - got).max() < 1e-4
    assert np.abs(forward(tied.cfg, tied.weights, [1, 2, 3]) - got).max() > 1e-2


@pytest.mark.parametrize("model_type, archs, ok", [
    ("qwen2", ["LlamaForCausalLM"], False),
    ("llama", ["Qwen3MoeForCausalLM"], False),
    ("llama", ["LlamaForCausalLM"], True),
    ("llama", ["MyOwnLlamaForCausalLM"], True),  # an architecture fuel does not know: model_type decides
    ("llama", [], True),
])
def test_model_type_against_architectures(model_type, archs, ok):
    raw = {**M.CONFIG, "model_type": model_type, "architectures": archs}
    if ok:
        assert from_hf_config(raw).family == model_type
    else:
        with pytest.raises(ConfigError, match=f"model_type '{model_type}' disagrees with architectures"):
            from_hf_config(raw)


def test_a_duplicate_gguf_key_is_refused(tmp_path):
    meta = M.tiny_gguf_meta()
    p = tmp_path / "t.gguf"
    p.write_bytes(M.gguf_bytes(meta + [("llama.block_count", M.U32, 2)])[0])
    with pytest.raises(InputError, match="key 'llama.block_count' appears twice"):
        read_gguf(p)


def test_a_gguf_tensor_count_lower_than_the_tensors_written(tmp_path):
    """The last tensor infos would be read as tensor data, shifting every tensor: refused."""
    tensors = M.tiny_gguf_tensors()
    p = tmp_path / "t.gguf"
    p.write_bytes(M.gguf_bytes(tensors=tensors, n_tensors=len(tensors) - 1)[0])
    with pytest.raises(InputError, match=f"bytes after the last of the header's {len(tensors) - 1} tensors"):
        read_gguf(p)


def test_a_bos_id_beyond_the_vocabulary(tmp_path):
    with pytest.raises(ConfigError, match="bos_token_id=8 is outside the vocabulary"):
        from_hf_config({**M.CONFIG, "bos_token_id": 8})
    meta = [m if m[0] != "tokenizer.ggml.bos_token_id" else (m[0], M.U32, 8) for m in M.tiny_gguf_meta()]
    p = tmp_path / "t.gguf"
    p.write_bytes(M.gguf_bytes(meta)[0])
    with pytest.raises(InputError, match="tokenizer.ggml.bos_token_id is 8, outside the vocabulary of 8 tokens"):
        read_gguf(p)


def test_arabic_indic_digits_in_tokens_read_as_numbers():
    from fuelcli.cli.options import parse_tokens

    assert parse_tokens("١,٢,٣") == parse_tokens("1,2,3") == [1, 2, 3]
    with pytest.raises(InputError, match="--tokens takes comma-separated integers"):
        parse_tokens("1,x")


@pytest.mark.parametrize("option, value", [("temp", float("inf")), ("temp", float("nan")),
                                           ("repeat_penalty", float("inf")), ("top_p", float("nan")),
                                           ("min_p", float("nan"))])
def test_non_finite_sampling_options_are_refused(option, value):
    from fuelcli.text.generate import SamplerParams

    with pytest.raises(InputError, match=f"--{option.replace('_', '-')} must be"):
        SamplerParams(**{option: value})
