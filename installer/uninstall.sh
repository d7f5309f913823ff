#!/usr/bin/env bash
# Remove what installer/install.sh put on this machine.
#
#   installer/uninstall.sh [--prefix DIR] [--purge]
#
# Removes the venv, the `officellm` launcher, the console's desktop entry and the systemd
# --user unit (disabling it first). The user's data - the database (officellm.db), the admin
# token, cached model weights - stays unless --purge is given. Use the same --prefix (and the
# same OFFICELLM_BIN_DIR / XDG_* environment) as for the install.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=installer/paths.sh
. "$HERE/paths.sh"

PREFIX_ARG="" PURGE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX_ARG="${2:?--prefix needs a directory}"; shift ;;
        --prefix=*) PREFIX_ARG="${1#*=}" ;;
        --purge) PURGE=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "uninstall.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
officellm_paths "$PREFIX_ARG"

say() { printf '==> %s\n' "$*"; }
ours() { [ -f "$1" ] && grep -qF -- "$OFFICELLM_MARK" "$1"; }
# Shared files (desktop entry, unit) are removed only when they point at this install's
# launcher, so uninstalling one prefix leaves another install's entries alone.
ours_for_this_install() { ours "$1" && grep -qF -- "$LAUNCHER" "$1"; }
remove() { rm -rf -- "$1"; say "removed $1"; }

if ours_for_this_install "$UNIT_FILE"; then
    if systemd_user_works; then
        systemctl --user disable --now officellm.service >/dev/null 2>&1 || true
    fi
    remove "$UNIT_FILE"
    systemd_user_works && systemctl --user daemon-reload || true
fi
ours_for_this_install "$DESKTOP_FILE" && remove "$DESKTOP_FILE"
ours "$LAUNCHER" && remove "$LAUNCHER"
# A venv we made has pyvenv.cfg; refuse to rm -rf anything else that happens to be there.
if [ -f "$VENV_DIR/pyvenv.cfg" ]; then
    remove "$VENV_DIR"
elif [ -e "$VENV_DIR" ]; then
    echo "uninstall.sh: $VENV_DIR is not a virtual environment; left alone" >&2
fi
if [ -n "$PREFIX" ]; then
    # Tidy the prefix if nothing else lives there.
    rmdir -- "$BIN_DIR" 2>/dev/null || true
    rmdir -- "$PREFIX" 2>/dev/null || true
fi

if [ "$PURGE" = 1 ]; then
    for dir in "$DATA_DIR" "$APP_DIR" "$CACHE_DIR" "$CONFIG_DIR"; do
        [ -e "$dir" ] && remove "$dir"
    done
    say "officellm and its data are gone"
else
    rmdir -- "$APP_DIR" 2>/dev/null || true   # only if empty
    if [ -d "$DATA_DIR" ]; then
        say "kept your data in $DATA_DIR (database, admin token); --purge removes it"
    fi
    say "officellm uninstalled"
fi
