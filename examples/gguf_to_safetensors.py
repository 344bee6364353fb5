"""Write an HF model directory (config.json, bf16 model.safetensors, tokenizer files with the chat
template) from a GGUF file or a demo alias, with transformers doing the conversion: a local
safetensors checkpoint for the README's examples without the hub.

    pip install -e '.[test]'     # transformers, torch, gguf
    python examples/gguf_to_safetensors.py smollm2-135m ./SmolLM2-135M-Instruct
    fuel run ./SmolLM2-135M-Instruct "What is the capital of France?" --temp 0 -n 32

transformers dequantises the GGUF's blocks to f32 (and un-permutes llama's q/k rows); the weights
are then rounded to bf16, as hub checkpoints store them. The same recipe as the tests' SmolLM2
fixture (tests/real_models.py). The directory is written beside OUT and renamed into place.
"""

import copy
import importlib.util
import json
import shutil
import sys
from pathlib import Path


def convert(gguf_path: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if out.exists():
        sys.exit(f"error: {out} exists")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                     dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        # A GGUF-loaded model carries a "gguf quantizer" and refuses save_pretrained: copy its
        # dequantised weights into a plain model built from the same config.
        cfg = copy.deepcopy(model.config)
        if hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
        cfg.dtype = torch.bfloat16
        plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
        missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            sys.exit(f"error: conversion left weights missing {missing} or unexpected {unexpected}")
        if cfg.tie_word_embeddings:
            plain.tie_weights()
        plain.generation_config = copy.deepcopy(model.generation_config)
        plain.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        # transformers 5 writes the chat template to chat_template.jinja; older readers look in
        # tokenizer_config.json, so it goes there too
        tc_path = tmp / "tokenizer_config.json"
        tc = json.loads(tc_path.read_text())
        if getattr(tok, "chat_template", None) and "chat_template" not in tc:
            tc["chat_template"] = tok.chat_template
            tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list) -> int:
    from fuelcli.errors import FuelError
    from fuelcli.process.extras import pip_install
    from fuelcli.sources.source import resolve

    if len(argv) != 2:
        print("usage: python examples/gguf_to_safetensors.py GGUF_FILE_OR_DEMO_ALIAS OUT_DIR", file=sys.stderr)
        return 2
    absent = [m for m in ("torch", "transformers", "gguf") if importlib.util.find_spec(m) is None]
    if absent:  # the conversion is transformers': a one-line answer, not a traceback
        print(f"error: the conversion needs {', '.join(absent)} (fuel's test extra): pip install -e '.[test]' "
              f"in a checkout, or {pip_install('test')}", file=sys.stderr)
        return 4
    try:
        src = resolve(argv[0])  # a .gguf path or a pulled demo alias (fuel pull ALIAS)
    except FuelError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    if src.kind != "gguf":
        print(f"error: {argv[0]} is not a GGUF file", file=sys.stderr)
        return 2
    print(convert(src.path, Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
