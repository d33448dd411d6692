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

# NVRTC, the CUDA headers, ptxas and cuobjdump from NVIDIA's PyPI wheels,
# unpacked into .local/cuda/nvidia (the layout of a wheel install), for the
# kernel builds of the demo and the tests. Pinned, so a build key stays put.
CUDA_WHEELS=(
    nvidia-cuda-nvrtc-cu12==12.9.86
    nvidia-cuda-runtime-cu12==12.9.79
    nvidia-cuda-nvcc-cu12==12.9.86
    nvidia-cuda-cuobjdump==13.5.37
)
CUDA_DIR="$PWD/.local/cuda/nvidia"

ensure_cuda_wheels() {
    local stamp="$PWD/.local/cuda/installed"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${CUDA_WHEELS[*]}" ]; then
        export GPUARCH_CUDA_DIR="$CUDA_DIR"
        return 0
    fi
    python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
    local wheels="$PWD/.local/cuda/wheels"
    rm -rf "$PWD/.local/cuda"
    mkdir -p "$wheels"
    echo "downloading NVIDIA wheels: ${CUDA_WHEELS[*]}" >&2
    python3 -m pip download -q --no-deps --only-binary=:all: \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --dest "$wheels" "${CUDA_WHEELS[@]}"
    for w in "$wheels"/*.whl; do
        python3 -m zipfile -e "$w" "$PWD/.local/cuda/"
    done
    # zipfile drops the executable bits.
    chmod +x "$CUDA_DIR"/*/bin/* 2>/dev/null || true
    rm -rf "$wheels"
    echo "${CUDA_WHEELS[*]}" >"$stamp"
    export GPUARCH_CUDA_DIR="$CUDA_DIR"
}

# FlashInfer's own wheels from PyPI, kept as wheels under .local/flashinfer:
# flashinfer-cubin (458 MB, 16,017 files, almost all for Blackwell), which
# gpuarch imports and serves, and flashinfer-python of the same version,
# whose loader reads what it serves. Downloaded once, again only when the
# version changes. Exports GPUARCH_FLASHINFER_CUBIN_WHEEL and
# GPUARCH_FLASHINFER_PYTHON_WHEEL.
FLASHINFER_VERSION=0.6.13
ensure_flashinfer_wheels() {
    local dir="$PWD/.local/flashinfer" v="$FLASHINFER_VERSION"
    local cubin="$dir/flashinfer_cubin-$v-py3-none-any.whl"
    local python="$dir/flashinfer_python-$v-py3-none-any.whl"
    if ! [ -f "$cubin" ] || ! [ -f "$python" ]; then
        python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
        rm -rf "$dir"
        mkdir -p "$dir"
        echo "downloading flashinfer-cubin and flashinfer-python $v (about 470 MB)" >&2
        python3 -m pip download -q --no-deps --only-binary=:all: --dest "$dir" \
            "flashinfer-cubin==$v" "flashinfer-python==$v"
    fi
    export GPUARCH_FLASHINFER_CUBIN_WHEEL="$cubin" GPUARCH_FLASHINFER_PYTHON_WHEEL="$python"
}

# Real wheels for the image audit's checks against cuobjdump
# (tests/tests/audit.rs), each unpacked where an image keeps pip's
# packages: .local/audit-images/NAME-VERSION/usr/local/lib/python3.12/
# site-packages, the distribution's metadata and its shared libraries (the
# rest of a wheel is Python the audit does not read). Downloaded once.
# - bitsandbytes 0.45.5 (76 MB): a library per CUDA release, 11.7 to 12.8,
#   each with SASS for its own set of GPUs and no PTX;
# - xformers 0.0.34 (106 MB): its own library and a FlashAttention-3 built
#   for sm_80 and sm_90a, which it launches only from 8.0;
# - vLLM 0.33.0 (321 MB): its main library for sm_75 to sm_120, and
#   libraries built for Hopper or SM100 alone, chosen by capability.
# Exports GPUARCH_BNB_IMAGE, GPUARCH_XFORMERS_IMAGE, GPUARCH_VLLM_IMAGE.
BNB_VERSION=0.45.5
XFORMERS_VERSION=0.0.34
VLLM_VERSION=0.33.0
# Unpack wheel NAME==VERSION (about SIZE) into its image directory; print
# that directory.
audit_image() {
    local name=$1 version=$2 size=$3 platform=$4
    local dir="$PWD/.local/audit-images/$name-$version"
    local site="$dir/usr/local/lib/python3.12/site-packages"
    if ! [ -f "$dir/installed" ]; then
        python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
        rm -rf "$dir"
        mkdir -p "$site"
        echo "downloading $name $version (about $size)" >&2
        python3 -m pip download -q --no-deps --only-binary=:all: \
            --platform "$platform" --python-version 3.12 \
            --dest "$dir/wheel" "$name==$version" >&2
        python3 - "$dir"/wheel/*.whl "$site" <<'PY'
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as z:
    for m in z.namelist():
        if ".dist-info/" in m or m.endswith(".so") or ".so." in m:
            z.extract(m, sys.argv[2])
PY
        rm -rf "$dir/wheel"
        touch "$dir/installed"
    fi
    echo "$dir"
}
ensure_audit_images() {
    GPUARCH_BNB_IMAGE=$(audit_image bitsandbytes "$BNB_VERSION" "76 MB" manylinux_2_24_x86_64)
    GPUARCH_XFORMERS_IMAGE=$(audit_image xformers "$XFORMERS_VERSION" "106 MB" manylinux_2_28_x86_64)
    GPUARCH_VLLM_IMAGE=$(audit_image vllm "$VLLM_VERSION" "321 MB" manylinux_2_28_x86_64)
    export GPUARCH_BNB_IMAGE GPUARCH_XFORMERS_IMAGE GPUARCH_VLLM_IMAGE
}

# A venv of Debian's python3 holding torch and the CUDA 13 toolkit from
# PyPI (scripts/lib/torch-image.txt), for the container half of
# scripts/gpu-check part 7 where there is no GPU: torch's own
# cpp_extension.load building a CUDA extension with nvcc, and Triton
# compiling a kernel. Debian's python3, because a uid other than root must
# be able to run it (pyenv's sits in root's home). About 5 GiB; installed
# once, again only when the list changes. Exports GPUARCH_TORCH_PYTHON and
# GPUARCH_TORCH_CUDA_HOME.
ensure_torch_image() {
    local dir="$PWD/.local/torch-image" list="$PWD/scripts/lib/torch-image.txt"
    local stamp="$dir/installed" site
    if ! [ -f "$stamp" ] || ! cmp -s "$stamp" "$list"; then
        rm -rf "$dir"
        echo "installing torch and the CUDA 13.0 toolkit into $dir (about 3 GB of wheels)" >&2
        /usr/bin/python3 -m venv "$dir"
        "$dir/bin/pip" install -q --no-cache-dir --no-deps --only-binary=:all: -r "$list"
        cp "$list" "$stamp"
    fi
    site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # The runtime wheel carries libcudart.so.13 alone; torch links
    # extensions with -lcudart, which wants the development link a toolkit
    # (or NVIDIA's -devel image) has beside it.
    ln -sf libcudart.so.13 "$site/nvidia/cu13/lib/libcudart.so"
    export GPUARCH_TORCH_PYTHON="$dir/bin/python"
    export GPUARCH_TORCH_CUDA_HOME="$site/nvidia/cu13"
}

# The workspace's debug build, as every script and the tests' artifacts()
# (tests/src/lib.rs) make it: with --tests, so that cargo resolves features
# with the dev-dependencies, as `cargo test` does. One build then serves all
# of them; a plain `cargo build --workspace` resolved memchr and serde_core
# without them and built 349 units a second time (100 CPU-s).
build_debug_workspace() {
    cargo build --locked --workspace --lib --bins --tests "$@"
}

# The .deb to test: GPUARCH_DEB where scripts/test made it already, else a
# fresh scripts/package. Prints its path.
package_deb() {
    if [ -n "${GPUARCH_DEB:-}" ]; then echo "$GPUARCH_DEB"; else ./scripts/package; fi
}

# A cargo subcommand from crates.io at a pinned version: ensure_cargo_tool
# CRATE VERSION (cargo-deb for scripts/package, cargo-fuzz for scripts/fuzz).
# Built unoptimized: each is a driver whose work is done by others (xz in
# cargo-deb, cargo and libFuzzer for cargo-fuzz), and a fresh CI machine
# builds both. Here cargo-deb took 87 CPU-s optimized, 41 unoptimized, and
# then 16 s to package instead of 14; cargo-fuzz 54 and 32.
ensure_cargo_tool() {
    local crate=$1 version=$2
    if cargo "${crate#cargo-}" --version 2>/dev/null | grep -qx "$crate $version"; then
        return 0
    fi
    echo "installing $crate $version" >&2
    cargo install --debug --locked --quiet "$crate" --version "$version"
}
ensure_cargo_deb() { ensure_cargo_tool cargo-deb 3.8.0; }
ensure_cargo_fuzz() { ensure_cargo_tool cargo-fuzz 0.13.2; }

# The engines of today's nodes, each in a Debian root under .local/engines
# (tests/src/stack.rs runs them there, in a mount namespace of their own):
# sid's containerd 2.1 (NRI on by default), Docker 28 (its CLI and compose
# v2 are packages of their own there), podman 5, runc 1.3, crun and Slurm;
# trixie's containerd 1.7 (NRI in its config). Pinned; when the mirror no
# longer has a pinned release (sid moves on), the root is built from what
# it has, and the versions it got are printed and kept in the root's
# `versions` file for the tests to report. `mount` (unpinned) gives the
# root the umount that drops the host's root after pivot_root. About 30 s
# each, once per checkout (or when the list changes).
ENGINE_ROOTS=(
    "sid containerd=2.1.9+ds1-5 runc=1.3.6+ds1-1 crun=1.28-1 docker.io=28.5.2+dfsg4-5 docker-cli=28.5.2+dfsg4-5 docker-compose=2.40.3-3 podman=5.8.6+ds1-3 slurm-wlm=26.05.5-1 mount"
    "trixie containerd=1.7.24~ds1-6+deb13u1 runc=1.1.15+ds1-2+b4 mount"
)

ensure_engine_roots() {
    command -v mmdebstrap >/dev/null || apt_install mmdebstrap
    local spec suite pins root stamp
    for spec in "${ENGINE_ROOTS[@]}"; do
        suite=${spec%% *}
        pins=${spec#* }
        root="$PWD/.local/engines/$suite"
        stamp="$root.installed"
        if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$spec" ] && [ -x "$root/usr/bin/containerd" ]; then
            continue
        fi
        rm -rf "$root" "$stamp"
        mkdir -p "$PWD/.local/engines"
        echo "building the $suite engine root: $pins" >&2
        if ! engine_root "$suite" "$root" "${pins// /,},ca-certificates"; then
            echo "WARNING: the mirror's $suite lacks a pinned release; building from what it has" >&2
            rm -rf "$root"
            engine_root "$suite" "$root" "$(echo "$pins" | sed -E 's/=[^ ]+//g; s/ /,/g'),ca-certificates"
        fi
        # Host-network pods copy the node's hosts file; a minimal root has none.
        [ -e "$root/etc/hosts" ] || printf '127.0.0.1 localhost\n' >"$root/etc/hosts"
        chroot "$root" dpkg-query -W containerd runc crun docker.io docker-cli docker-compose podman slurm-wlm 2>/dev/null \
            | tee "$root/versions" >&2 || true
        echo "$spec" >"$stamp"
    done
}

engine_root() {
    as_root mmdebstrap --quiet --variant=apt \
        --aptopt='Acquire::Check-Valid-Until "false"' \
        --include="$3" "$1" "$2"
}

# The Debian root that scripts/test-deb and scripts/test-systemd install
# the package into: a minbase root with systemd (to boot it, and for
# systemd-analyze and systemd-sysusers), dbus, man-db (to render the man
# pages), podman and runc (a container through the installed hook) and
# busybox (its rootfs). Made once per checkout with mmdebstrap, as a
# tarball that each of them unpacks into a fresh directory of its own, so
# every run still starts from a root the package never touched; scripts/test
# makes it in the background, beside the build. ensure_deb_root SUITE;
# exports GPUARCH_DEB_ROOT_TAR. About 24 s to make here, 4 s to unpack.
DEB_ROOT_PACKAGES=systemd,dbus,man-db,podman,runc,busybox-static
ensure_deb_root() {
    local suite=$1 dir="$PWD/.local/roots"
    local tar="$dir/$suite.tar" stamp="$dir/$suite.installed"
    if ! [ -f "$tar" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$DEB_ROOT_PACKAGES" ]; then
        command -v mmdebstrap >/dev/null || apt_install mmdebstrap
        rm -f "$tar" "$stamp"
        mkdir -p "$dir"
        echo "building the $suite root for the package's tests: $DEB_ROOT_PACKAGES" >&2
        as_root mmdebstrap --quiet --variant=minbase --include="$DEB_ROOT_PACKAGES" \
            "$suite" "$tar.part.tar"
        mv "$tar.part.tar" "$tar"
        echo "$DEB_ROOT_PACKAGES" >"$stamp"
    fi
    export GPUARCH_DEB_ROOT_TAR="$tar"
}

# A fresh copy of that root: unpack_deb_root SUITE DIR.
unpack_deb_root() {
    ensure_deb_root "$1"
    mkdir -p "$2"
    tar --numeric-owner -xpf "$GPUARCH_DEB_ROOT_TAR" -C "$2"
}
