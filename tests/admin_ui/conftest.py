"""Console tests: Qt offscreen, QSettings in a temporary place, never the user's own."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(scope="session", autouse=True)
def isolated_qsettings(tmp_path_factory):
    from PySide6.QtCore import QCoreApplication, QSettings

    path = tmp_path_factory.mktemp("qsettings")
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(path))
    QCoreApplication.setOrganizationName("officellm-tests")
    QCoreApplication.setApplicationName("officellm-admin-tests")
    return path


@pytest.fixture(scope="module")
def console_data_dir(tmp_path_factory, request):
    """OFFICELLM_DATA_DIR for this module: the console's state file and the server's DB and
    admin token live there, never in the user's real data dir."""
    path = tmp_path_factory.mktemp("officellm-data")
    old = os.environ.get("OFFICELLM_DATA_DIR")
    os.environ["OFFICELLM_DATA_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("OFFICELLM_DATA_DIR", None)
    else:
        os.environ["OFFICELLM_DATA_DIR"] = old
