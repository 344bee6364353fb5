"""The decoder as data: what a model is and computes, read by the reference (assembly/) and every engine.

    config.py         ModelConfig from config.json or GGUF metadata, each value with its origin
    block.py          what each decoder layer computes (attention, norms, FFN), one Block per layer
    rope.py           rotary embeddings: inverse frequencies per scaling type, cos/sin tables
    plan.py           the layer plan and the mask plan, derived from the blocks
    sizes.py          what a config implies in bytes, checked before anything is allocated
    finite.py         NaN and inf in the logits stop with NonFinite
"""
