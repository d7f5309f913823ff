"""`officellm admin` on a desktop whose Qt xcb plugin cannot load says which packages to
install (admin_ui/qt_platform.py), instead of Qt's "could not load the Qt platform plugin"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from officellm.admin_ui.qt_platform import (
    debian_package,
    missing_libraries,
    uses_xcb,
    xcb_plugin,
    xcb_problem,
)

# What ldd prints for the plugin on a fresh Debian 12 desktop (trimmed).
LDD_MISSING = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibQt6XcbQpa.so.6 => /opt/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007f1)
\tlibxcb-cursor.so.0 => not found
\tlibxcb-icccm.so.4 => not found
\tlibxkbcommon-x11.so.0 => not found
\tlibxcb-cursor.so.0 => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)
"""
LDD_COMPLETE = "\tlibxcb.so.1 => /lib/x86_64-linux-gnu/libxcb.so.1 (0x00007f3)\n"
PLUGIN = Path("/opt/PySide6/Qt/plugins/platforms/libqxcb.so")
DESKTOP = {"DISPLAY": ":0"}


@pytest.mark.parametrize(("soname", "package"), [
    ("libxcb-cursor.so.0", "libxcb-cursor0"), ("libxcb-icccm.so.4", "libxcb-icccm4"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"), ("libX11-xcb.so.1", "libx11-xcb1"),
    ("libdbus-1.so.3", "libdbus-1-3"), ("libEGL.so.1", "libegl1")])
def test_a_missing_library_is_named_by_its_debian_package(soname: str, package: str) -> None:
    assert debian_package(soname) == package


def test_the_missing_libraries_are_each_named_once() -> None:
    assert missing_libraries(PLUGIN, lambda _: LDD_MISSING) == [
        "libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxkbcommon-x11.so.0"]


def test_a_desktop_missing_xcb_libraries_gets_the_one_apt_get_line() -> None:
    message = xcb_problem(DESKTOP, PLUGIN, lambda _: LDD_MISSING)
    assert message is not None
    assert ("  sudo apt-get install libxcb-cursor0 libxcb-icccm4 libxkbcommon-x11-0"
            in message.splitlines())


def test_a_desktop_with_every_library_is_left_to_qt() -> None:
    assert xcb_problem(DESKTOP, PLUGIN, lambda _: LDD_COMPLETE) is None


@pytest.mark.parametrize(("environ", "xcb"), [
    ({"DISPLAY": ":0"}, True), ({}, False), ({"QT_QPA_PLATFORM": "offscreen", "DISPLAY": ":0"},
                                              False),
    ({"QT_QPA_PLATFORM": "xcb"}, True), ({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"},
                                         False)])
def test_only_a_console_that_would_open_on_xcb_is_checked(environ, xcb: bool) -> None:
    assert uses_xcb(environ) is xcb
    if not xcb:
        assert xcb_problem(environ, PLUGIN, lambda _: LDD_MISSING) is None


def test_officellm_admin_prints_the_line_and_exits_2_where_libraries_are_missing() -> None:
    """The real command on this machine, when its xcb plugin does lack libraries."""
    plugin = xcb_plugin()
    if plugin is None or not missing_libraries(plugin):
        pytest.skip("this machine's Qt xcb plugin has every library it needs, so there is "
                    "nothing for `officellm admin` to report")
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM",
                                                             "WAYLAND_DISPLAY")}
    env["DISPLAY"] = ":99"
    done = subprocess.run([sys.executable, "-m", "officellm.cli", "admin"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "sudo apt-get install " in done.stderr
    assert "could not load the Qt platform plugin" not in done.stderr
