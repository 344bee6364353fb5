"""Text in and out: tokenizers, sampling, grammars, chat and speculative decoding.

    tokenizer.py       text <-> token ids, chat templates, streaming detokenization
    gguf_tokenizer.py  a tokenizer built from GGUF metadata, matching llama.cpp
    token_bytes.py     the bytes each token id stands for
    generate.py        the sampler chain and stopping, text as it is generated
    grammar.py         constrained decoding: JSON schema, GBNF or Lark as a token mask
    chat.py            a conversation kept in the KV cache
    speculative.py     speculative decoding: a draft model or prompt lookup, verified by the target
"""
