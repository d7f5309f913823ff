"""Whether Qt's xcb platform plugin can load on this desktop, and the one `apt-get` line that
fixes it when it cannot (fresh Debian/Ubuntu desktops often lack libxcb-cursor0 and its
friends; the installer adds them only when DISPLAY is set at install time). Qt's own message,
"could not load the Qt platform plugin", names no package. No Qt here: it runs before Qt."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

_NOT_FOUND = re.compile(r"^\s*(\S+\.so[.\d]*)\s+=>\s+not found", re.MULTILINE)


def xcb_plugin() -> Path | None:
    """PySide6's xcb platform plugin, if PySide6 is installed with one."""
    try:
        import PySide6
    except ImportError:
        return None
    path = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return path if path.is_file() else None


def _ldd(path: Path) -> str:
    try:
        return subprocess.run(["ldd", str(path)], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""  # no ldd: nothing can be said, and Qt will speak for itself


def missing_libraries(plugin: Path, ldd: Callable[[Path], str] = _ldd) -> list[str]:
    """The shared libraries the plugin (and what it links) needs and the loader cannot find,
    by soname, each once."""
    return sorted(set(_NOT_FOUND.findall(ldd(plugin))))


def debian_package(soname: str) -> str:
    """The Debian package that ships `soname`, by Debian's library naming policy:
    libxcb-cursor.so.0 is libxcb-cursor0, libxkbcommon-x11.so.0 is libxkbcommon-x11-0."""
    name, _, version = soname.partition(".so")
    name, version = name.lower(), version.lstrip(".").split(".")[0]
    if not version:
        return name
    return f"{name}-{version}" if name[-1].isdigit() else f"{name}{version}"


def uses_xcb(environ: Mapping[str, str]) -> bool:
    """Whether Qt will pick the xcb plugin: on Linux, under X11 (DISPLAY, no Wayland
    session), unless QT_QPA_PLATFORM names another."""
    platform = environ.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.split(":")[0] == "xcb"
    return (sys.platform.startswith("linux") and bool(environ.get("DISPLAY"))
            and not environ.get("WAYLAND_DISPLAY"))


def xcb_problem(environ: Mapping[str, str], plugin: Path | None = None,
                ldd: Callable[[Path], str] = _ldd) -> str | None:
    """What to tell the admin when the console would open on xcb and its plugin cannot load:
    the libraries missing and the `apt-get install` line; None when nothing is missing."""
    if not uses_xcb(environ):
        return None
    plugin = plugin or xcb_plugin()
    if plugin is None:
        return None
    missing = missing_libraries(plugin, ldd)
    if not missing:
        return None
    packages = " ".join(sorted({debian_package(s) for s in missing}))
    return ("The console cannot open its window: Qt's X11 (xcb) platform plugin needs "
            f"libraries this system lacks ({', '.join(missing)}). Install them with:\n"
            f"  sudo apt-get install {packages}\n"
            "then run `officellm admin` again.")
