"""The ground floor: reading and writing files, for every package above.

    files.py          regular files only, every OS error one InputError
    jsondoc.py        the one reader of every JSON document fuel reads
    filehash.py       SHA-256 of model files, remembered by (path, size, mtime)
    derived_cache.py  where derived caches live (compiled kernels, GGUF headers), atomic writes
"""
