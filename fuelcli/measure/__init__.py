"""Measuring fuel as llama.cpp's tools measure llama.cpp.

    bench.py        llama-bench: prefill and decode throughput, against peers (`fuel bench`)
    perplexity.py   llama-perplexity's method over a text (`fuel perplexity`)
"""
