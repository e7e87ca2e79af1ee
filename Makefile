# torch2jax developer entry points. `make test` works from a fresh clone with only Python installed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-slow test-ops-full test-ops-eager test-ops-compile test-models-full test-models-hf test-generation-hf models-doc demo runtime-check lint docs bench bench-calls bench-eager bench-compile bench-large bench-serve bench-vlm bench-finetune bench-recurrent clean

install: $(STAMP)

# torch==2.13.0 first: it is the local CPU wheel; letting pip resolve torch itself pulls CUDA builds.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[convert,test]'
	touch $(STAMP)

test: install
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not slow" --durations=25

# Every OpInfo, every dtype, every sample; records docs/opinfo_results.json (after every case) for `make docs`.
# Hours on 2 cores: `OPINFO_DTYPE=float32` sweeps one dtype and keeps the report's others; `RESUME=1` goes on
# from the report, skipping the cases it already has at every sample.
OPINFO_DTYPE ?=
RESUME ?=
test-ops-full: install
	T2J_OPINFO_DTYPES=$(or $(OPINFO_DTYPE),all) T2J_OPINFO_MERGE=$(if $(OPINFO_DTYPE),1,) T2J_OPINFO_RESUME=$(RESUME) \
		T2J_OPINFO_SAMPLES=0 T2J_OPINFO_REPORT=docs/opinfo_results.json T2J_RUN_KNOWN_FAILURES=1 \
		$(PY) -m pytest -q -n 2 $(if $(OPINFO_DTYPE),tests/ops/test_opinfo.py,tests/ops)

# Every OpInfo on the eager jax device (~12 min on 2 cores); records docs/opinfo_eager_results.json for `make docs`.
EAGER_DTYPES ?= float32,int32,bool
test-ops-eager: install
	T2J_EAGER_OPINFO=all T2J_EAGER_OPINFO_DTYPES=$(EAGER_DTYPES) T2J_OPINFO_EAGER_REPORT=docs/opinfo_eager_results.json \
		$(PY) -m pytest -q -n 2 tests/eager/test_opinfo_eager.py

# Every OpInfo through torch.compile(backend="torch2jax") (the default run takes every 16th op), in the export
# sweep's dtype rotation, one sample each; records docs/opinfo_compile_results.json for docs/ops.md's compile column.
test-ops-compile: install
	T2J_OPINFO_COMPILE_EVERY=1 T2J_OPINFO_COMPILE_REPORT=docs/opinfo_compile_results.json \
		$(PY) -m pytest -q -n 2 tests/eager/test_opinfo_compile.py

# The slow model tier: benchmark-sized configs and the rest of the bfloat16 variants (tests/models, -m slow).
test-models-full: install
	$(PY) -m pytest -q -m slow tests/models tests/eager

# Every test make test leaves out (-m slow, all folders): the other task heads, architectures and console-script runs.
test-slow: install
	$(PY) -m pytest -q -n 2 --dist worksteal -m slow

demo: install
	$(PY) scripts/demo.py

# Load an artifact in a separate virtualenv that has no torch at all.
runtime-check: install
	rm -rf .venv-runtime /tmp/torch2jax-runtime-check
	$(PYTHON) -m venv .venv-runtime
	.venv-runtime/bin/pip install -q .
	$(VENV)/bin/torch2jax convert sample_models/mlp.py:MLP --out /tmp/torch2jax-runtime-check -q
	.venv-runtime/bin/python -c "import importlib.util, sys; assert importlib.util.find_spec('torch') is None, 'torch is installed'; \
	import numpy as np, torch2jax; m = torch2jax.load('/tmp/torch2jax-runtime-check'); \
	y = m(np.ones((3, 16), np.float32)); print('runtime-check ok: no torch installed,', m, 'output', y.shape)"

# Benchmarks (a full run takes ~15 min on 2 cores): writes docs/benchmarks.md and docs/benchmarks.png.
# `make bench BENCH_ARGS=--quick` runs three models and writes to build/benchmarks-quick/ instead.
# torch==2.13.0 is named again so that pip keeps the installed CPU wheel while it resolves the extra.
BENCH_STAMP := $(VENV)/.bench-installed
BENCH_ARGS ?=

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[convert,test,bench]' torch==2.13.0
	$(PY) -c "import torch; assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__"
	touch $(BENCH_STAMP)

# Bytecode first, as an installed package has it: where PYTHONDONTWRITEBYTECODE is set, every
# process would otherwise compile the lowering modules from source inside the timed `lower` stage.
bench: $(BENCH_STAMP)
	$(PY) -m compileall -q torch2jax
	$(PY) -m benchmarks.run $(BENCH_ARGS)
	$(if $(findstring --quick,$(BENCH_ARGS)),,$(PY) -m benchmarks.call_overhead)

# LoRA fine-tuning against PEFT on torch eager, and LoRA's memory against full fine-tuning's (~2 min): rewrites its
# section of docs/benchmarks.md.
bench-finetune: $(BENCH_STAMP)
	$(PY) -m pip install -q -e '.[finetune]' peft
	$(PY) -m benchmarks.finetune

# Recurrent and hybrid causal LMs (13 families: Mamba, Mamba2, Jamba, Qwen3.5, ...) against transformers' generate, and
# Mamba2's decode step at 64 and 1,024 tokens of context (~15 min on 2 cores): rewrites its section of docs/benchmarks.md.
bench-recurrent: $(BENCH_STAMP)
	$(PY) -m benchmarks.recurrent

# Prompt lookup against plain greedy decoding, batch 1, on a copying workload (~10 min on 2 cores the first time: it
# trains a small copying Llama in torch, cached under TORCH2JAX_BENCH_CACHE): rewrites its section of docs/benchmarks.md.
.PHONY: bench-prompt-lookup
bench-prompt-lookup: $(BENCH_STAMP)
	$(PY) -m benchmarks.prompt_lookup

# Per-call overhead alone (~2 min): rewrites its section of docs/benchmarks.md.
bench-calls: $(BENCH_STAMP)
	$(PY) -m benchmarks.call_overhead

# Streamed conversion of 0.5 to 4 GB checkpoints it writes under /tmp (~10 min, needs ~4 GB of disk per size):
# peak RSS and time against reading the files once; rewrites its section of docs/benchmarks.md.
bench-large: install
	$(PY) -m benchmarks.large

# The eager jax device, per op and a small Llama forward (~2 min): rewrites its section of docs/benchmarks.md.
bench-eager: $(BENCH_STAMP)
	$(PY) -m benchmarks.eager

# Vision-language generation (a LLaVA-shaped model, one image, batch 1) against transformers eager (~3 min):
# rewrites its section of docs/benchmarks.md.
bench-vlm: $(BENCH_STAMP)
	$(PY) -m benchmarks.vlm

# torch.compile(backend="torch2jax") against inductor and the exported artifact (~5 min): rewrites its section.
bench-compile: $(BENCH_STAMP)
	$(PY) -m benchmarks.compile

# `torch2jax serve` under a bounded load (32 requests, 8 clients, 2 timed rounds) against static batches of the same artifact and
# `transformers serve --continuous-batching` (~15 min on 2 busy cores): rewrites its section of docs/benchmarks.md.
bench-serve: install
	$(PY) -m pip install -q fastapi && $(PY) -m pip install -q --no-deps accelerate  # transformers serve: its server, device_map
	$(PY) -m benchmarks.serve
	$(PY) -m benchmarks.serve_workloads  # a shared prefix (prefix caching) and long prompts among decoding rows
	$(PY) -m benchmarks.serve_seq2seq  # an encoder-decoder: continuous batching against static batches
	$(PY) -m benchmarks.structured_output  # what a JSON schema costs per output token

# Decoding against llama.cpp (llama-cpp-python builds from source, ~10 min the first time; the GGUF files are written here
# with the gguf package): ours and llama.cpp's at four weight formats, one core and every core (~15 min on 2 cores):
# rewrites its section of docs/benchmarks.md.
.PHONY: bench-llama-cpp
bench-llama-cpp: $(BENCH_STAMP)
	$(PY) -m pip install -q gguf llama-cpp-python
	$(PY) -m benchmarks.llama_cpp

# The architecture sweep (hours on 2 cores; resumable: rows already in benchmarks/hf_sweep/results.json are
# skipped): every transformers model type, base model and main task head, each in its own process with a time
# limit, against torch.onnx + onnxruntime; then docs/models.md. HF_SWEEP_ARGS="--only bert gpt2", "--limit 20",
# "--shard 0/2". configs.json comes from `python -m benchmarks.hf_sweep.extract_configs <transformers checkout>`.
HF_SWEEP_ARGS ?=
test-models-hf: $(BENCH_STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.hf_sweep.run $(HF_SWEEP_ARGS)
	$(PY) -m benchmarks.hf_sweep.report

# Every generating class (causal LM, encoder-decoder, image-text-to-text): greedy tokens against transformers' generate,
# before and after save + load (resumable; hours on 2 cores); docs/models.md's generation section from its results.
test-generation-hf: $(BENCH_STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m benchmarks.hf_sweep.generation $(HF_SWEEP_ARGS)
	$(PY) -m benchmarks.hf_sweep.report

# docs/models.md from the committed sweep results.
models-doc: install
	$(PY) -m benchmarks.hf_sweep.report

lint: install
	$(VENV)/bin/ruff check torch2jax cli tests scripts sample_models benchmarks

docs: install
	$(PY) scripts/gen_ops_doc.py

clean:
	rm -rf $(VENV) .venv-runtime demo_artifact .pytest_cache
