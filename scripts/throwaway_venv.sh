# Sourced by the scripts that test with Python packages: makes a virtual
# environment in a temporary directory that is removed on exit.
#
#   source "$script_dir/throwaway_venv.sh"
#   throwaway_venv NAME MIN_MINOR   # sets $tmp and $py (the venv's python)
#
# When python3 (3.MIN_MINOR or newer), venv or pip is unavailable it prints
# "SKIP: <reason>" and exits 0.

skip() {
    echo "SKIP: $*"
    exit 0
}

throwaway_venv() {
    local name=$1 min_minor=$2
    command -v python3 >/dev/null 2>&1 || skip "python3 not found"
    python3 -c "import sys; sys.exit(sys.version_info < (3, $min_minor))" 2>/dev/null ||
        skip "python3 is older than 3.$min_minor"
    python3 -c 'import venv, ensurepip' 2>/dev/null ||
        skip "python3 has no venv/ensurepip module (e.g. install python3-venv)"
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/$name.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    trap 'exit 130' INT TERM
    python3 -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1 ||
        skip "python3 -m venv failed: $(tail -n 1 "$tmp/venv.log")"
    py="$tmp/venv/bin/python"
    "$py" -m pip --version >/dev/null 2>&1 || skip "pip is unavailable in the virtual environment"
}
