"""Tiny HF checkpoints -> GGUF by llama.cpp's own converter (convert_hf_to_gguf.py from the
llama-cpp-python sdist: conftest.llama_converter), as users' files are written.

The converter runs in a child process (its gguf-py must not replace the installed gguf package
here), all conversions of a test module in one. The tiny checkpoints' byte tokenizer
(tiny_models.write_byte_tokenizer) is no vocabulary the converter knows by its hash, so the driver
names its pre-tokenizer "gpt2" (get_vocab_base_pre), and Gemma 4's vocabulary (which its converter
reads as SentencePiece pieces, LlamaHfVocab) goes the GPT-2 way too: every tensor and every model
key is still written by llama.cpp's code.

    python llama_convert.py CONVERTER_DIR MODEL_DIR OUT.gguf [MODEL_DIR OUT.gguf ...]
"""

import json
import subprocess
import sys
from pathlib import Path


def convert(converter: Path, pairs: list) -> None:
    """pairs: (model_dir, out_path); each model_dir gets a byte tokenizer first."""
    from tiny_models import write_byte_tokenizer

    args = []
    for model_dir, out in pairs:
        write_byte_tokenizer(model_dir)
        # GPT2Tokenizer: the class Phi-3's converter takes for a byte-level vocabulary (else it wants
        # tokenizer.model); special tokens named from the byte alphabet: a family's tokenizer class
        # (Qwen2's) would otherwise add its own <|endoftext|> past the 256 ids
        (Path(model_dir) / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "GPT2Tokenizer", "eos_token": "a", "unk_token": None, "pad_token": None,
             "bos_token": None}))
        args += [str(model_dir), str(out)]
    subprocess.run([sys.executable, __file__, str(converter), *args], check=True, capture_output=True, timeout=600)


def for_llama_cpp(src, dst, pre: str) -> None:
    """src rewritten to dst with what llama.cpp's vocabulary loader asks for and these tests do not use
    (ids go in with --tokens): a merges list, and a pre-tokenizer name it knows for the family (it
    refuses "gpt2" for gemma4 and wants merges for any BPE vocabulary)."""
    import gguf
    import numpy as np

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "tokenizer.ggml.pre"):
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(f.name, f.contents())
        else:
            w.add_key_value(f.name, f.contents(), f.types[0])
    w.add_tokenizer_pre(pre)
    w.add_token_merges(["a b"])
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=[int(n) for n in reversed(t.shape)], raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _main(converter: Path, args: list) -> None:
    sys.path.insert(0, str(converter))
    sys.path.insert(1, str(converter / "gguf-py"))
    import conversion.base as base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt2"
    import conversion.gemma as gemma

    gemma.Gemma4Model.set_vocab = lambda self: self._set_vocab_gpt2()
    import convert_hf_to_gguf

    for model_dir, out in zip(args[0::2], args[1::2]):
        sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", out, "--outtype", "f32"]
        convert_hf_to_gguf.main()


if __name__ == "__main__":
    _main(Path(sys.argv[1]), sys.argv[2:])
