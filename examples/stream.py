"""fuel as a library: load a model, prefill a chat prompt, stream a greedy continuation.

    python examples/stream.py MODEL "prompt"     # MODEL: directory, .gguf file, demo alias or hub id
"""

import sys

from fuelcli.backends import make_engine
from fuelcli.process.memory import peak_rss_bytes
from fuelcli.assembly.loader import open_model
from fuelcli.text.generate import Sampler, SamplerParams, Stats, generate

model = open_model(sys.argv[1])
ids = model.tokenizer.encode_prompt(sys.argv[2])
engine = make_engine(model.cfg, model.weights, n_ctx=len(ids) + 64)
stats = Stats()
for piece in generate(engine, model.tokenizer, ids, 64, Sampler(SamplerParams(temp=0.0)), model.eos_ids(), [], stats):
    print(piece, end="", flush=True)
print()
print(stats.line(peak_rss_bytes()), file=sys.stderr)
