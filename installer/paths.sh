# Where a (non-dev) officellm install puts things, and helpers the installer scripts share.
# Sourced by install.sh, uninstall.sh and build_bundle.sh so that they always agree. Every location comes from the environment (HOME, XDG_*,
# OFFICELLM_BIN_DIR, OFFICELLM_DATA_DIR), which is also how the tests sandbox an install.
# shellcheck shell=bash

# officellm_paths [PREFIX]: set the path variables below for an install into PREFIX
# (empty: the default, under the user's data dir).
officellm_paths() {
    local prefix="${1:-}"
    : "${HOME:?HOME must be set}"
    local data_home="${XDG_DATA_HOME:-$HOME/.local/share}"
    local config_home="${XDG_CONFIG_HOME:-$HOME/.config}"

    # APP_DIR matches platformdirs.user_data_dir("officellm"), where the server keeps its
    # database and admin token unless OFFICELLM_DATA_DIR says otherwise.
    APP_DIR="$data_home/officellm"
    DATA_DIR="${OFFICELLM_DATA_DIR:-$APP_DIR}"
    CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/officellm"   # dequantized GGUF weights
    CONFIG_DIR="$config_home/officellm"

    if [ -n "$prefix" ]; then
        PREFIX="$(realpath -m -- "$prefix")"
        VENV_DIR="$PREFIX/venv"
        BIN_DIR="${OFFICELLM_BIN_DIR:-$PREFIX/bin}"
    else
        PREFIX=""
        VENV_DIR="$APP_DIR/venv"
        BIN_DIR="${OFFICELLM_BIN_DIR:-$HOME/.local/bin}"
    fi
    LAUNCHER="$BIN_DIR/officellm"
    DESKTOP_FILE="$data_home/applications/officellm-admin.desktop"
    UNIT_FILE="$config_home/systemd/user/officellm.service"
}

# A line that marks files we wrote, so the uninstaller never deletes someone else's file.
OFFICELLM_MARK="# Written by officellm's installer/install.sh"

# True when `systemctl --user` can talk to a user manager (not the case in most containers,
# over plain ssh without lingering, or as root without a login session). Tests set
# OFFICELLM_NO_SYSTEMCTL=1: a sandboxed install must never touch the real user manager.
systemd_user_works() {
    [ -z "${OFFICELLM_NO_SYSTEMCTL:-}" ] && command -v systemctl >/dev/null 2>&1 \
        && systemctl --user show-environment >/dev/null 2>&1
}

# copy_source_tree SRC DEST: the working tree minus VCS, venvs and build outputs. Wheels are
# built from such a copy because setuptools reuses an in-tree build/ directory, where a
# module deleted from the checkout would live on and be shipped.
copy_source_tree() {
    mkdir -p "$2"
    tar -C "$1" -c --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist \
        --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache \
        --exclude=.ruff_cache . | tar -C "$2" -x
}
