#!/usr/bin/env bash
# Builds the mllm_rs Python module (mllm-python/) into a throwaway virtual
# environment and runs its pytest suite.
#
# Usage: scripts/test_python.sh [pytest args...]
#
# `pip install ./mllm-python` builds the wheel with maturin, in cargo's
# release profile (MLLM_PYTHON_PROFILE overrides it) and the workspace's
# target directory, so a second run compiles only what changed. Only when python3,
# venv or pip is unavailable does it print "SKIP: <reason>" and exit 0; a
# failed install or test is a failure.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
profile="${MLLM_PYTHON_PROFILE:-release}"

# shellcheck source=scripts/throwaway_venv.sh
source "$root/scripts/throwaway_venv.sh"
throwaway_venv mllm-python-test 9
pip=("$py" -m pip --disable-pip-version-check --quiet)
"${pip[@]}" install "pytest==8.4.2" "numpy>=1.21"
MATURIN_PEP517_ARGS="--profile $profile" "${pip[@]}" install "$root/mllm-python"
cd "$root/mllm-python"
"$py" -m pytest -q -p no:cacheprovider tests "$@"
