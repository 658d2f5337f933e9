# Two commands a newcomer needs: `make demo` and `make test`. (-qq: pip prints errors only.)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# On a machine without CUDA take the CPU wheel of torch first; an unpinned torch pulls a CUDA build.
TORCH_SPEC ?= torch==2.13.0
# Every package pinned to what CI tested; `make constraints` refreshes the pins.
CONSTRAINTS := constraints.txt

.PHONY: demo test test-full lint setup clean gpu-check constraints

setup: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -qq -c $(CONSTRAINTS) "$(TORCH_SPEC)"
	$(BIN)/pip install -qq -c $(CONSTRAINTS) -e ".[dev,peers]"
	touch $(STAMP)

# Refresh the pins: the newest versions pyproject.toml allows (torch stays TORCH_SPEC), written to
# constraints.txt. Run `make test` on the result before committing it.
constraints:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade --upgrade-strategy eager -e ".[dev,peers]" "$(TORCH_SPEC)"
	{ sed -n '1,2p' $(CONSTRAINTS); $(BIN)/pip freeze --exclude-editable | \
	  grep -v -i -e '^seqpar' -e '^-e' | sed -e 's/+cpu$$//'; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	touch $(STAMP)

# The quickstart sweep (ring vs ulysses vs allgather vs local, ~1-2 min on 2 cores) into the default
# MLflow store ./mlflow.db (artifacts in ./mlartifacts): it prints its table, the MLflow link and
# how to serve the UI once; the lines after say where to go next.
demo: $(STAMP)
	$(BIN)/seqpar sweep examples/quickstart.yaml
	@echo "Next:"
	@echo "  every run, its params, metrics, per-rank JSON and plots: serve MLflow as above, then open"
	@echo "    http://127.0.0.1:5000/#/experiments/1?workflowType=machine_learning  (Model training view)"
	@echo "  $(BIN)/seqpar compare --baseline local   each trial's step time over local's, 95% intervals"
	@echo "  $(BIN)/seqpar report                     report.html: tables, plots, environment in one page"

# pytest on two workers side by side (pytest-xdist): the gang's tests on one, the embedded Ray's on
# the other, the rest on whichever is free (tests/parallel.py; docs/development.md, "The budget").
# PYTEST_WORKERS=0: one process, in the suite's order.
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS)

test: $(STAMP)
	$(BIN)/ruff check seqpar tests benchmarks
	$(PYTEST)

# `make test`, plus the large products whole (make test runs covering designs of them) and the tests
# marked slow (second Ray clusters, the manual's long commands: tests/docs)
test-full: $(STAMP)
	$(BIN)/ruff check seqpar tests benchmarks
	SEQPAR_TEST_FULL=1 $(PYTEST)

# On a machine with CUDA GPUs: flash-attn where a prebuilt wheel fits the installed torch (else it
# says why and runs without), then benchmarks/gpu_check.py on every GPU (NCCL with 2+): every
# algorithm checked in bfloat16 and float16, an accuracy sweep (documents, windows, GQA, head dims
# 128 and 72), a training sweep ({replicated, fsdp} x checkpoint modes x fused head, bf16 with fp32
# master weights); one summary, exit 1 on a failure. Then the same through the platform (Ray actors,
# NCCL, MLflow): a one-trial attention sweep (examples/gpu-check.yaml) and a training trial
# (examples/gpu-train.yaml). Elsewhere it says it needs CUDA and exits 0. The script runs on a bare
# machine too (torch only): `python benchmarks/gpu_check.py`.
gpu-check: $(STAMP)
	@n=$$($(BIN)/python -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"); \
	if [ "$${n:-0}" -lt 1 ]; then \
		echo "make gpu-check needs CUDA GPUs; this torch sees none: nothing to check"; exit 0; fi; \
	echo "make gpu-check: $$n GPU(s)"; \
	$(BIN)/python benchmarks/gpu_check.py --install-flash-attn --world $$n && \
	$(BIN)/seqpar sweep examples/gpu-check.yaml --set plan.world=$$n && \
	$(BIN)/seqpar sweep examples/gpu-train.yaml --set plan.world=$$n

lint: $(STAMP)
	$(BIN)/ruff check seqpar tests benchmarks

clean:
	rm -rf $(VENV) mlruns mlflow.db mlartifacts .pytest_cache
