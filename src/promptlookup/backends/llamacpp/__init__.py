"""The target over llama.cpp (``llama-cpp-python``): :mod:`.target`."""
