"""Measuring fuel as llama.cpp's tools measure llama.cpp.

    bench.py          llama-bench: prefill and decode throughput (`fuel bench`), its runs and loop
    bench_spec.py     the tests to run: -p, -n, -d, --parallel
    bench_results.py  the timed runs, the model measured, the report
    bench_render.py   the report as md, csv, json
    bench_peers.py    the peers of --compare, each in a process of its own
    roofline.py       bytes a decode step reads, and the read bandwidth it is held against
    first_token.py    the wait from `fuel run` to its first token (`fuel bench --first-token`)
    speculation.py    speculative decoding's speed-up (`fuel bench --lookup-decoding | --draft-model`)
    perplexity.py     llama-perplexity's method over a text (`fuel perplexity`)
"""
