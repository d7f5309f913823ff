"""Show a newly issued API key once, with a Copy button: the server stores only its hash."""

from __future__ import annotations

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
)


class KeyDialog(QDialog):
    def __init__(self, user: str, key: str, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"New API key for {user}")
        self.key = key
        layout = QVBoxLayout(self)
        note = QLabel(f"This is <b>{user}</b>'s new key. It is shown <b>only this once</b>: "
                      "copy it now and give it to them. Lost keys cannot be recovered, only "
                      "revoked and reissued.")
        note.setWordWrap(True)
        layout.addWidget(note)
        row = QHBoxLayout()
        self.field = QLineEdit(key)
        self.field.setReadOnly(True)
        self.field.setMinimumWidth(420)
        row.addWidget(self.field)
        self.copy_button = QPushButton("Copy")
        self.copy_button.clicked.connect(self.copy)
        row.addWidget(self.copy_button)
        layout.addLayout(row)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        buttons.accepted.connect(self.accept)
        layout.addWidget(buttons)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.key)
        self.copy_button.setText("Copied")
