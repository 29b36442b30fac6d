# Sourced by the scripts that run tests under an emulator: finds the tools
# they need and the Debian packages that provide them, and installs those
# packages or names them.
#
#     lack DESCRIPTION PACKAGE...   a tool is missing (for checks of its own)
#     need COMMAND-OR-FILE PACKAGE...   `lack` unless it is on PATH or exists
#     ensure_tools INSTALL CHECK    runs the function CHECK (which calls
#         `need` and `lack`); when something is missing, installs the
#         packages with apt-get if INSTALL is 1 (as root, or through sudo,
#         after refreshing the package lists) and runs CHECK again; returns
#         1, after naming what is missing and the command that installs it,
#         if anything still is.
#     as_root COMMAND...            COMMAND as root (through sudo if needed)

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    else
        sudo "$@"
    fi
}

lack() {
    missing_tools+=("$1")
    shift
    missing_packages+=("$@")
}

need() {
    if ! command -v "$1" >/dev/null && [ ! -e "$1" ]; then
        lack "$@"
    fi
}

ensure_tools() {
    local install=$1 check=$2
    missing_tools=()
    missing_packages=()
    "$check"
    if [ "${#missing_packages[@]}" -ne 0 ] && [ "$install" -eq 1 ]; then
        local packages
        mapfile -t packages < <(printf '%s\n' "${missing_packages[@]}" | sort -u)
        echo "installing ${packages[*]}" >&2
        as_root apt-get update -q >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" >&2
        missing_tools=()
        missing_packages=()
        "$check"
    fi
    if [ "${#missing_tools[@]}" -ne 0 ]; then
        printf 'missing: %s\n' "${missing_tools[@]}" >&2
        echo "install them with:" >&2
        echo "    sudo apt-get install $(printf '%s\n' "${missing_packages[@]}" | sort -u | xargs)" >&2
        return 1
    fi
}
