"""Each backend names the block features it runs (backends.check_features): a model whose blocks ask
for more is refused by make_engine in one line naming the feature and a layer, before anything is
built; the CPU engine runs every feature (test_decoder_oracle)."""

import pytest

from fuelcli.backends import CUDA_FEATURES, make_engine
from fuelcli.errors import InputError
from fuelcli.model.block import features
from fuelcli.assembly.loader import open_model


@pytest.mark.parametrize("case, feature", [
    ("gemma3", "a RoPE base or scaling per layer"),
    ("smollm3", "layers without RoPE"),
])
def test_cuda_refuses_what_it_does_not_run(tiny, case, feature):
    m = open_model(str(tiny(case)))
    assert feature in features(m.cfg) and feature not in CUDA_FEATURES
    with pytest.raises(InputError) as e:
        make_engine(m.cfg, m.weights, n_ctx=8, device="cuda")
    msg = str(e.value)
    assert "\n" not in msg and "the cuda backend does not run" in msg and "use --device cpu" in msg


def test_plain_models_have_no_features(tiny):
    """Llama, Qwen2 (windows), Qwen3-MoE (routing) and YaRN need nothing beyond the plain decoder:
    the cuda backend is not refused for them by this check (negative control of the one above)."""
    for case in ("llama31", "qwen2_window", "qwen3_moe_norm_false", "qwen2_yarn", "mixtral"):
        assert features(open_model(str(tiny(case))).cfg) == {}, case


def test_every_gemma3_feature_is_named(tiny):
    assert set(features(open_model(str(tiny("gemma3"))).cfg)) == {
        "a RoPE base or scaling per layer", "post-attention and post-FFN norms", "a gelu_tanh FFN",
        "an embedding scale", "an attention scale other than 1/sqrt(head_dim)", "a final logit softcap"}
