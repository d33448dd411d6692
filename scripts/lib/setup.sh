# Shared set-up for scripts/demo and scripts/test: make sure a Rust toolchain
# with rustfmt and clippy is on PATH, installing it on a fresh Debian machine.
# shellcheck shell=bash

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "need root to run: $*" >&2; return 1
    fi
}

apt_install() {
    local missing=()
    for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing: ${missing[*]}" >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

ensure_rust() {
    if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    if ! command -v cargo >/dev/null; then
        echo "no Rust toolchain: installing one with rustup" >&2
        apt_install ca-certificates curl gcc libc6-dev
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    if command -v rustup >/dev/null; then
        cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
        cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
    fi
}
