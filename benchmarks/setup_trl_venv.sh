#!/usr/bin/env bash
# Creates the TRL side of the side-by-side benchmark: its own venv, exactly the commands of the TRL baseline
# (/work/shared/bench/setup_trl_venv.sh; pinned freeze in requirements-trl-baseline.txt beside this script).
# Usage: bash benchmarks/setup_trl_venv.sh [VENV_DIR]      (default benchmarks/.trl-venv, git-ignored)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${1:-$HERE/.trl-venv}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install torch==2.13.0            # resolves to the local CPU wheel 2.13.0+cpu
# TRL 1.12.0 is the LAST release that ships PPOTrainer (trl.experimental.ppo); 1.13.0+ removed it.
"$VENV/bin/pip" install trl==1.12.0 transformers==5.24.0 datasets==5.2.0 accelerate==1.15.0
# The freeze must equal requirements-trl-baseline.txt (the recorded baseline's environment).
"$VENV/bin/pip" freeze | diff - "$HERE/requirements-trl-baseline.txt" && echo "pip freeze matches the baseline"
