#!/usr/bin/env bash
# Checks an OpenAI-compatible server with the official `openai` Python client.
#
# Usage: scripts/openai_client_check.sh BASE_URL [--api-key KEY]
#   e.g. scripts/openai_client_check.sh http://127.0.0.1:8080/v1
#
# Installs a pinned `openai` into a throwaway virtual environment in a temporary
# directory, runs scripts/openai_client_check.py with it and removes the environment.
# Exits with the check's status. Only when python3, venv or pip is unavailable does it
# print "SKIP: <reason>" and exit 0; a failed install is a failure.
# OPENAI_VERSION overrides the pinned version.
set -euo pipefail

# openai 3.x needs Python >= 3.10; 1.109.1 is the last release for Python 3.8/3.9.
OPENAI_VERSION="${OPENAI_VERSION:-}"
OPENAI_VERSION_PY310="3.54.0"
OPENAI_VERSION_PY38="1.109.1"

if [ $# -lt 1 ]; then
    echo "usage: $0 BASE_URL [--api-key KEY]" >&2
    exit 2
fi
base_url=$1
shift
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# shellcheck source=scripts/throwaway_venv.sh
source "$script_dir/throwaway_venv.sh"
throwaway_venv openai-client-check 8

if [ -z "$OPENAI_VERSION" ]; then
    if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
        OPENAI_VERSION=$OPENAI_VERSION_PY310
    else
        OPENAI_VERSION=$OPENAI_VERSION_PY38
    fi
fi
"$py" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION" \
    >"$tmp/pip.log" 2>&1 || {
    echo "pip cannot install openai==$OPENAI_VERSION:" >&2
    tail -n 20 "$tmp/pip.log" >&2
    exit 1
}

status=0
"$py" "$script_dir/openai_client_check.py" --base-url "$base_url" "$@" || status=$?
exit "$status"
