"""A runnable model assembled from its parts: above the engines (backends/) and the text (text/).

    loader.py         MODEL -> config, weights and tokenizer, whatever the file kind
    reference.py      the readable oracle: a plain numpy forward over the same blocks and weights
    forward_paths.py  a sequence's logits by each of the three forward paths
    inspect_views.py  what `fuel inspect` shows, as plain data
"""
