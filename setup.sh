#!/usr/bin/env bash
# Create .venv and install the workbench with its JupyterLab (lab) and test (dev) extras.
# PyTorch is installed FIRST and pinned, so that pip never resolves `torch` to a CUDA build on a
# CPU-only machine. GPU users: set TORCH_SPEC (e.g. TORCH_SPEC="torch==2.13.0" with the CUDA index
# of your choice in PIP_INDEX_URL / --extra-index-url), see README "Installing on a GPU machine".
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "installing $TORCH_SPEC ..."
  .venv/bin/python -m pip install -q "$TORCH_SPEC"
fi
.venv/bin/python -m pip install -q -e ".[lab,dev]"
.venv/bin/python -c "import torch, workbench; print('workbench', workbench.__version__, '| torch', torch.__version__, '| cuda', torch.cuda.is_available())"
