"""Register a model: its name, its kind, and where it comes from — a file or directory on the
server's machine (typed, or picked when the server runs on this one), or a Hugging Face Hub
repo id that the server downloads in the background — and, as `officellm models add` may, its
aliases, idle sleep and serve options (admin_ui/model_fields.py reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
)

from officellm.admin_ui.model_fields import parse_aliases, parse_options, parse_sleep_idle_seconds

# The registry's kinds (app/registry/entry.py's KINDS, written out: the console imports
# nothing of the server's).
KINDS = ("generate", "embed", "transcribe", "rerank")


@dataclass(frozen=True)
class NewModel:
    """What the dialog asks the server to register (AdminClient.add_model's arguments)."""

    name: str
    kind: str
    source: str | None = None
    hub_repo: str | None = None
    pinned: bool = False
    aliases: tuple[str, ...] = ()
    sleep_idle_seconds: float | None = None  # None: the server's --sleep-idle-seconds
    options: dict[str, Any] = field(default_factory=dict)


class AddModelDialog(QDialog):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add a model")
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("the name requests ask for, e.g. qwen3-8b")
        form.addRow("Name", self.name_edit)
        self.kind_box = QComboBox()
        self.kind_box.addItems(KINDS)
        form.addRow("Kind", self.kind_box)
        self.pinned_check = QCheckBox("Pinned (loaded at start, never unloaded to make room)")
        form.addRow("", self.pinned_check)
        self.aliases_edit = QLineEdit()
        self.aliases_edit.setPlaceholderText("request names that reach it, e.g. gpt-4*, claude-*")
        form.addRow("Aliases", self.aliases_edit)
        self.sleep_edit = QLineEdit()
        self.sleep_edit.setPlaceholderText("seconds without a request before it sleeps "
                                           "(0: never; empty: the server's)")
        form.addRow("Idle sleep", self.sleep_edit)
        self.options_edit = QLineEdit()
        self.options_edit.setPlaceholderText("max_model_len=8192 dtype=bfloat16, or JSON")
        self.options_edit.setToolTip(
            "Serve options: dtype, quantization, kv_cache_dtype, max_model_len, "
            "kv_cache_memory, tool_call_parser, reasoning_parser (docs/models.md).")
        form.addRow("Options", self.options_edit)
        layout.addLayout(form)

        self.from_path = QRadioButton("A file or directory on the server's machine")
        self.from_hub = QRadioButton("A Hugging Face Hub repo (the server downloads it)")
        self.origin = QButtonGroup(self)
        self.origin.addButton(self.from_path)
        self.origin.addButton(self.from_hub)
        self.from_path.setChecked(True)

        layout.addWidget(self.from_path)
        path_row = QHBoxLayout()
        self.path_edit = QLineEdit()
        self.path_edit.setPlaceholderText("/models/Qwen3-8B or /models/qwen3-8b.Q4_K_M.gguf")
        # The path is read by the server: the pickers help only when it runs on this machine.
        self.file_button = QPushButton("File…")
        self.file_button.setToolTip("Pick a .gguf file (the server reads the path you pick: "
                                    "use it when the server runs on this computer).")
        self.file_button.clicked.connect(self.pick_file)
        self.dir_button = QPushButton("Directory…")
        self.dir_button.setToolTip("Pick a Hugging Face model directory (the server reads the "
                                   "path you pick: use it when the server runs on this computer).")
        self.dir_button.clicked.connect(self.pick_directory)
        for w in (self.path_edit, self.file_button, self.dir_button):
            path_row.addWidget(w)
        layout.addLayout(path_row)

        layout.addWidget(self.from_hub)
        self.hub_edit = QLineEdit()
        self.hub_edit.setPlaceholderText("e.g. Qwen/Qwen3-8B")
        layout.addWidget(self.hub_edit)
        # Typing in one field picks its origin, so nobody has to click the radio first.
        self.path_edit.textEdited.connect(lambda _: self.from_path.setChecked(True))
        self.hub_edit.textEdited.connect(lambda _: self.from_hub.setChecked(True))

        self.problem = QLabel("")
        self.problem.setStyleSheet("color: #a00;")
        self.problem.setWordWrap(True)
        layout.addWidget(self.problem)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def pick_file(self) -> None:
        picked, _ = QFileDialog.getOpenFileName(self, "Model file", "",
                                                "GGUF models (*.gguf);;All files (*)")
        if picked:
            self.path_edit.setText(picked)
            self.from_path.setChecked(True)

    def pick_directory(self) -> None:
        picked = QFileDialog.getExistingDirectory(self, "Model directory")
        if picked:
            self.path_edit.setText(picked)
            self.from_path.setChecked(True)

    def request(self) -> NewModel:
        """What was filled in (check `problem_text` first: a malformed alias, idle sleep or
        option raises ValueError here)."""
        hub = self.from_hub.isChecked()
        return NewModel(name=self.name_edit.text().strip(), kind=self.kind_box.currentText(),
                        source=None if hub else self.path_edit.text().strip() or None,
                        hub_repo=(self.hub_edit.text().strip() or None) if hub else None,
                        pinned=self.pinned_check.isChecked(),
                        aliases=tuple(parse_aliases(self.aliases_edit.text())),
                        sleep_idle_seconds=parse_sleep_idle_seconds(self.sleep_edit.text()),
                        options=parse_options(self.options_edit.text()))

    def problem_text(self) -> str | None:
        """Why the form cannot be sent yet; None when it can (the server checks the rest)."""
        try:
            r = self.request()
        except ValueError as exc:
            return str(exc)
        if not r.name:
            return "Give the model a name."
        if any(c.isspace() for c in r.name):
            return "A model's name has no spaces."
        if self.from_hub.isChecked() and not r.hub_repo:
            return "Type the Hub repo id, e.g. Qwen/Qwen3-8B."
        if self.from_path.isChecked() and not r.source:
            return "Type or pick the model's file or directory."
        return None

    def accept(self) -> None:
        """Close only once the form is complete; otherwise say what is missing."""
        problem = self.problem_text()
        if problem:
            self.problem.setText(problem)
            return
        super().accept()
