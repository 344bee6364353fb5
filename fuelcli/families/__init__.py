"""One home per model family (llama.py, qwen2.py, qwen3.py, qwen3_moe.py), registered here."""

from .base import Family, FfnPlan
from .llama import LLAMA
from .qwen2 import QWEN2
from .qwen3 import QWEN3
from .qwen3_moe import QWEN3_MOE

FAMILIES = {f.model_type: f for f in (LLAMA, QWEN2, QWEN3, QWEN3_MOE)}
BY_ARCHITECTURE = {a: f for f in FAMILIES.values() for a in f.architectures}
BY_GGUF_ARCH = {f.gguf_arch: f for f in FAMILIES.values()}

__all__ = ["BY_ARCHITECTURE", "BY_GGUF_ARCH", "FAMILIES", "Family", "FfnPlan"]
