"""Where a model comes from: the MODEL argument turned into files on this machine.

    source.py         MODEL -> files on disk: a local path, a demo alias or a hub repo
    hub_gguf.py       which GGUF file of a hub repo (`owner/name:QUANT`, --hf-file)
    demo.py           demo models from PyPI data packages, `fuel pull`, FUEL_HOME
    local_models.py   the models on this machine (`fuel ls`, `fuel rm`)
"""
