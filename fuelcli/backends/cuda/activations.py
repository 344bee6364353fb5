"""Every activation of the CUDA forward, on the device, allocated once per engine for up to `rows`
tokens at a time (the prefill chunk); a decode step uses row 0."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class DeviceActivations(NamedTuple):
    tokens: object  # int32 [rows] token ids of a prefill chunk
    x: object  # [rows, H] residual stream
    h: object  # [rows, H] normed input (prefill; MoE layers)
    xn: object  # [1, H] a decode step's normed input of the next product (matvec.py's epilogue)
    done: object  # int32 [1] blocks finished, for the last-block epilogue (back at 0 after each launch)
    qkv: object  # [rows, q_dim + 2 kv_dim] q | k | v heads
    att: object  # [rows, q_dim] attention output before o_proj
    gate: object  # [rows, I] dense FFN gate, then silu(gate) * up
    up: object  # [rows, I]
    router: object  # [rows, experts] router logits, then probabilities
    experts: object  # int32 [rows, k] chosen experts
    expert_w: object  # [rows, k] their weights
    eg: object  # [rows * k, moe_I] silu(gate) * up of each chosen expert
    logits: object  # [1, vocab] logits of the last token
    argmax: object  # int32 [1] the id of the largest logit


def allocate(cuda, cfg, rows: int) -> DeviceActivations:
    def f32(*shape):
        return cuda.device_array(shape, np.float32)

    H, E, k = cfg.hidden_size, max(cfg.num_experts, 1), max(cfg.experts_per_tok, 1)
    return DeviceActivations(
        tokens=cuda.device_array(rows, np.int32), x=f32(rows, H), h=f32(rows, H), xn=f32(1, H),
        done=cuda.to_device(np.zeros(1, np.int32)),
        qkv=f32(rows, cfg.q_dim + 2 * cfg.kv_dim), att=f32(rows, cfg.q_dim), gate=f32(rows, max(cfg.intermediate_size, 1)),
        up=f32(rows, max(cfg.intermediate_size, 1)), router=f32(rows, E), experts=cuda.device_array((rows, k), np.int32),
        expert_w=f32(rows, k), eg=f32(rows * k, max(cfg.moe_intermediate_size, 1)), logits=f32(1, cfg.vocab_size),
        argmax=cuda.device_array(1, np.int32),
    )

