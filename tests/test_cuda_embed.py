"""/v1/embeddings' job on the CUDA engine (on numba's simulator unless a GPU is asked for), which holds
one sequence: the job falls back to its inputs one after another on slot 0 (base.Engine.step with
hidden=True runs that slot's prefill), and the vectors are the CPU engine's within float noise."""

import cuda_sim  # first: numba.cuda on the simulator
import numpy as np

from fuelcli.assembly.loader import open_model
from fuelcli.backends import make_engine
from fuelcli.serve.embed_job import EmbedJob
from fuelcli.serve.pooling import Embedder, Pooling

cuda_sim.speed_up()
pytestmark = cuda_sim.needs_numba_cuda


def test_one_sequence_engine_runs_the_inputs_one_by_one(tiny):
    m = open_model(str(tiny("qwen3_bias_headdim")))
    ids = [[5, 9, 3], [7], [11, 2]]
    embedder = Embedder(m.weights.final_norm, m.cfg.rms_norm_eps, Pooling("mean", "test"), m.cfg.hidden_size)
    gpu = EmbedJob(ids, embedder, None).run(make_engine(m.cfg, m.weights, n_ctx=8, device="cuda"), [0], 256)
    cpu = EmbedJob(ids, embedder, None).run(make_engine(m.cfg, m.weights, n_ctx=8, slots=3), [0, 1, 2], 256)
    assert gpu.forwards == len(ids) and cpu.forwards == 1
    assert float(np.abs(np.stack(gpu.vectors) - np.stack(cpu.vectors)).max()) < 1e-5
