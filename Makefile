# Set-up is part of every target: a fresh clone needs only `make translate` or `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL ?= checkpoints/de-en
DATA ?= ../shared/data/multi30k

.PHONY: setup serve test translate evaluate bench clean help

setup: $(VENV)/.installed

# torch is pinned to the CPU wheel here; on a CUDA machine install your CUDA torch first.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# Serve every model in checkpoints/ on http://127.0.0.1:8000 (flags: make serve ARGS="--port 9000").
serve: setup
	$(PY) -m nmt_serve.service $(ARGS)

# Test files spread over one pytest worker per core, at most 4 (pytest-xdist; a file stays on one worker, so
# its module fixtures start once); TEST_WORKERS=0 runs them in this process, one after another.
TEST_WORKERS ?= auto
test: setup
	$(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile)

# Translate lines from stdin with MODEL, or, with nothing piped in, a few demo sentences in its source language.
# SRC and TGT default to the model's own languages; a multilingual model (its config says mul) needs them:
# make translate MODEL=checkpoints/multi30k SRC=fr TGT=cs
MODEL_LANGS = $(shell $(PY) -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c["source_lang"], c["target_lang"])' $(MODEL)/config.json 2>/dev/null)
SRC ?= $(word 1,$(MODEL_LANGS))
TGT ?= $(word 2,$(MODEL_LANGS))
LANG_FLAGS = $(if $(filter-out mul,$(SRC)),--source-lang $(SRC)) $(if $(filter-out mul,$(TGT)),--target-lang $(TGT))
NEEDS_LANGS = if [ "$(SRC)" = mul ] || [ "$(TGT)" = mul ]; then echo "make $@: $(MODEL) is multilingual: give SRC= and TGT= (for example SRC=de TGT=en)" >&2; exit 2; fi

translate: setup
	@$(NEEDS_LANGS)
	@if [ -t 0 ]; then $(PY) -m nmt_serve.cli.translate --model $(MODEL) $(LANG_FLAGS) --demo; else $(PY) -m nmt_serve.cli.translate --model $(MODEL) $(LANG_FLAGS); fi

# Score MODEL on Multi30k's test_2016_flickr in SRC -> TGT.
evaluate: setup
	@$(NEEDS_LANGS)
	$(PY) -m nmt_serve.training.evaluate --model $(MODEL) $(LANG_FLAGS) --src $(DATA)/test_2016_flickr.$(SRC).gz --ref $(DATA)/test_2016_flickr.$(TGT).gz

# Benchmarks (not part of the tests): engines side by side, KV cache, the server under load.
bench: setup
	$(PY) -m pip install -q ctranslate2 transformers
	$(PY) -m bench.engines --output bench/results-engines.md
	$(PY) -m bench.server_load --output bench/results-server.md

clean:
	rm -rf $(VENV) .pytest_cache

help:
	@echo "make setup | serve [ARGS=...] | test | translate | evaluate | bench | clean"
	@echo "  MODEL=DIR    the checkpoint of translate and evaluate (default $(MODEL))"
	@echo "  SRC=L TGT=L  their languages: by default the model's own; a multilingual model (config.json: mul) needs them,"
	@echo "               passed on as --source-lang/--target-lang: make evaluate MODEL=checkpoints/multi30k SRC=de TGT=en"
	@echo "  DATA=DIR     evaluate's Multi30k (test_2016_flickr.SRC.gz and .TGT.gz; default $(DATA))"
