"""One home per model family, registered here: each says what its blocks are (model/block.py) and where
its files keep each weight (schema.py); the decoder is shared."""

from .base import Family, FfnPlan
from .gemma3 import GEMMA3
from .gemma4 import GEMMA4, GEMMA4_TEXT
from .gpt_oss import GPT_OSS
from .llama import LLAMA
from .mistral import MISTRAL
from .mixtral import MIXTRAL
from .phi3 import PHI3
from .qwen2 import QWEN2
from .qwen3 import QWEN3
from .qwen3_5 import QWEN3_5, QWEN3_5_MOE, QWEN3_5_MOE_VL, QWEN3_5_VL
from .qwen3_moe import QWEN3_MOE
from .qwen3_next import QWEN3_NEXT
from .smollm3 import SMOLLM3

FAMILIES = {f.model_type: f for f in (LLAMA, MISTRAL, MIXTRAL, QWEN2, QWEN3, QWEN3_MOE, SMOLLM3, GEMMA3, PHI3,
                                       QWEN3_5, QWEN3_5_MOE, QWEN3_5_VL, QWEN3_5_MOE_VL, QWEN3_NEXT, GPT_OSS, GEMMA4_TEXT,
                                       GEMMA4)}
BY_ARCHITECTURE = {a: f for f in FAMILIES.values() for a in f.architectures}
BY_GGUF_ARCH = {f.gguf_arch: f for f in FAMILIES.values() if f.gguf_arch}

__all__ = ["BY_ARCHITECTURE", "BY_GGUF_ARCH", "FAMILIES", "Family", "FfnPlan"]
