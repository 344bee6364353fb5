"""How to install each peer: the one text that bench, diff, `fuel doctor` and the README give
(tests/test_peers.py holds the README's copy to it).

llama-cpp-python compiles llama.cpp when it installs. A native build (GGML_NATIVE, its default)
crashes in eval on CPUs with AMX (Intel Sapphire Rapids and later: SIGSEGV or SIGILL, DESIGN.md
part B); there it is built for a fixed list of instruction sets instead.
"""

from ..process.extras import pip_install

LLAMA_CPP_AMX_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON "
                            "-DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_FMA=ON "
                            "-DGGML_F16C=ON")
LLAMA_CPP_AMX_BUILD = (f'CMAKE_ARGS="{LLAMA_CPP_AMX_CMAKE_ARGS}" pip install --force-reinstall --no-cache-dir '
                       "--no-binary llama-cpp-python llama-cpp-python")

LLAMA_CPP = (f"{pip_install('llama-cpp')} (llama-cpp-python: it compiles llama.cpp, several minutes); "
             f"on CPUs with AMX (Intel Sapphire Rapids and later) a native build crashes: there build it with "
             f"{LLAMA_CPP_AMX_BUILD}")
LLAMA_CPP_CRASH = (f"a native llama-cpp-python build crashes so on CPUs with AMX (Intel Sapphire Rapids and later); "
                   f"rebuild it with {LLAMA_CPP_AMX_BUILD}")

TRANSFORMERS = "pip install torch transformers (and gguf for a .gguf file)"
TRANSFORMERS_CRASH = "reinstall torch (pip install --force-reinstall torch) or run with FUEL_DEBUG=1 to see its stderr"
