"""Policies: the default and per-user forms; Save applies live through PUT (the server reads
policies per request, so the next request already follows the new one)."""

from __future__ import annotations

from PySide6.QtCore import QStringListModel, Qt
from PySide6.QtGui import QIntValidator
from PySide6.QtWidgets import (
    QComboBox,
    QCompleter,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from officellm.admin_ui.policy_values import (
    INT_FIELDS,
    LABELS,
    MODELS_NONE,
    ON_LIMIT_CHOICES,
    PRIORITY_CHOICES,
    PRIORITY_WEIGHTS,
    PolicyError,
    PolicyForm,
    form_to_policy,
)
from officellm.admin_ui.session import AdminSession

DEFAULT = "(default policy)"
MODELS_TOOLTIP = (
    "The registered models this policy's users may use, separated by commas "
    "(e.g. qwen3-8b, minilm). Blank (or \"all\"): every model in the default policy; the "
    "default's list in a user's override, whose own list replaces the default's. \"none\": "
    "no model at all. A model named \"none\" or \"all\" is written with a comma: none,")


class ModelNamesCompleter(QCompleter):
    """Completes the name after the last comma of the line edit, keeping the names before."""

    def __init__(self, edit: QLineEdit) -> None:
        super().__init__(edit)
        self.edit = edit
        self.names = QStringListModel(self)  # parented: Python keeps no other reference
        self.setModel(self.names)
        self.setCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.setCompletionMode(QCompleter.CompletionMode.PopupCompletion)

    def set_names(self, names: list[str]) -> None:
        self.names.setStringList(names)

    def splitPath(self, path: str) -> list[str]:  # noqa: N802 - Qt's name
        return [path.rsplit(",", 1)[-1].strip()]

    def pathFromIndex(self, index) -> str:  # noqa: N802 - Qt's name
        head, sep, _last = self.edit.text().rpartition(",")
        name = super().pathFromIndex(index)
        return f"{head}{sep} {name}" if sep else name


class PoliciesTab(QWidget):
    def __init__(self, session: AdminSession, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        self.policies: dict = {"default": {}, "users": {}}
        self.dirty = False  # the admin has edited the form since it was loaded
        layout = QVBoxLayout(self)
        top = QHBoxLayout()
        top.addWidget(QLabel("Policy for:"))
        self.target = QComboBox()
        self.target.addItem(DEFAULT)
        self.target.currentTextChanged.connect(self._load_form)
        top.addWidget(self.target)
        top.addStretch(1)
        self.reload_button = QPushButton("Reload")
        self.reload_button.clicked.connect(self.refresh)
        top.addWidget(self.reload_button)
        layout.addLayout(top)

        box = QGroupBox("Limits")
        form = QFormLayout(box)
        self.int_edits: dict[str, QLineEdit] = {}
        for name in INT_FIELDS:
            edit = QLineEdit()
            # The validator only stops letters; the range and "blank" rules are checked on
            # Save (policy_values), which names the field in plain words.
            edit.setValidator(QIntValidator(0, 2**31 - 1, edit))
            edit.textEdited.connect(self._edited)
            self.int_edits[name] = edit
            form.addRow(LABELS[name], edit)
        self.on_limit = QComboBox()
        self.on_limit.activated.connect(self._edited)
        form.addRow(LABELS["on_limit"], self.on_limit)
        self.share = QComboBox()
        self.share.activated.connect(self._edited)
        form.addRow(LABELS["share_prefix_cache"], self.share)
        layout.addWidget(box)

        sharing = QGroupBox("Sharing the machine (with the fair scheduling policy)")
        sform = QFormLayout(sharing)
        self.priority = QComboBox()
        self.priority.activated.connect(self._edited)
        sform.addRow(LABELS["priority"], self.priority)
        self.kv_share = QLineEdit()
        self.kv_share.textEdited.connect(self._edited)
        sform.addRow(LABELS["max_kv_share"], self.kv_share)
        layout.addWidget(sharing)

        models_box = QGroupBox("Models")
        mform = QFormLayout(models_box)
        self.models = QLineEdit()
        self.models.setToolTip(MODELS_TOOLTIP)
        self.models.textEdited.connect(self._edited)
        # The server's model names, to pick from as they are typed (asked in refresh).
        self.models_completer = ModelNamesCompleter(self.models)
        self.models.setCompleter(self.models_completer)
        # A completion replaces the text without textEdited: it is the admin's edit too.
        self.models_completer.highlighted.connect(self._edited)
        self.models_completer.activated.connect(self._edited)
        mform.addRow(LABELS["models"], self.models)
        layout.addWidget(models_box)

        self.hint = QLabel("")
        self.hint.setWordWrap(True)
        layout.addWidget(self.hint)
        buttons = QHBoxLayout()
        self.save_button = QPushButton("Save (applies at once)")
        self.save_button.clicked.connect(self.save)
        self.clear_button = QPushButton("Remove override")
        self.clear_button.clicked.connect(self.clear_override)
        buttons.addWidget(self.save_button)
        buttons.addWidget(self.clear_button)
        buttons.addStretch(1)
        layout.addLayout(buttons)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        layout.addWidget(self.message)
        layout.addStretch(1)
        session.changed.connect(self.refresh)
        self._setup_choices(is_default=True)

    def _edited(self, *_args) -> None:
        self.dirty = True

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        # Users added on the other tab appear here; an edit in progress is kept (see _show).
        super().showEvent(event)
        self.refresh()

    @property
    def is_default(self) -> bool:
        return self.target.currentText() == DEFAULT

    def _setup_choices(self, is_default: bool) -> None:
        blank = "no limit" if is_default else "inherit the default"
        for edit in self.int_edits.values():
            edit.setPlaceholderText(f"blank: {blank}")
        self.kv_share.setPlaceholderText("blank: " + ("no cap" if is_default
                                                      else "inherit the default")
                                         + "; e.g. 0.5 or 50%")
        self.models.setPlaceholderText(
            ("blank: every model" if is_default else "blank: the default's list")
            + f"; or names separated by commas; {MODELS_NONE}: no model")
        self.on_limit.clear()
        self.share.clear()
        self.priority.clear()
        if not is_default:
            self.on_limit.addItem("(inherit)", "")
            self.share.addItem("(inherit)", "")
            self.priority.addItem("(inherit)", "")
        for choice in ON_LIMIT_CHOICES:
            self.on_limit.addItem(choice, choice)
        for choice in PRIORITY_CHOICES:
            self.priority.addItem(f"{choice} (weight {PRIORITY_WEIGHTS[choice]:g})", choice)
        self.share.addItem("no", "no")
        self.share.addItem("yes", "yes")
        self.clear_button.setEnabled(not is_default)
        self.hint.setText(
            "reject: refuse with a sentence asking for a new chat; notify: answer that sentence "
            "as the assistant (for chat apps that hide errors); truncate: drop the oldest turns "
            "to fit. Priority: a high user is owed twice a normal one's share of the machine "
            "when both are busy; the KV share caps how much of the cache one user's prompts "
            "may fill while others wait." +
            ("" if is_default else " Blank fields follow the default policy."))

    def refresh(self) -> None:
        # Users too: a user without an override may be missing from the policies answer,
        # and the admin still needs to pick them to give them one.
        self.session.call(lambda c: (c.policies(), c.users()), self._show, self._error)
        # Completions only: a server that cannot list its models leaves the field plain text.
        self.session.call(lambda c: c.models(), self._show_models, lambda _exc: None)

    def _show_models(self, answer: dict) -> None:
        names = [m["name"] for m in answer.get("models") or [] if m.get("name")]
        self.models_completer.set_names(sorted(set(names)))

    def _show(self, result: tuple[dict, list[dict]]) -> None:
        policies, users = result
        self.policies = policies
        names = set(policies.get("users") or {}) | {u["name"] for u in users}
        current = self.target.currentText()
        self.target.blockSignals(True)
        self.target.clear()
        self.target.addItem(DEFAULT)
        for name in sorted(names):
            self.target.addItem(name)
        idx = self.target.findText(current)
        self.target.setCurrentIndex(max(0, idx))
        self.target.blockSignals(False)
        if not self.dirty:
            self._load_form(self.target.currentText())

    def _load_form(self, target: str) -> None:
        is_default = target == DEFAULT
        self._setup_choices(is_default)
        policy = (self.policies.get("default") if is_default
                  else (self.policies.get("users") or {}).get(target))
        self.set_form(PolicyForm.from_policy(policy))
        self.dirty = False

    def set_form(self, form: PolicyForm) -> None:
        for name, edit in self.int_edits.items():
            edit.setText(getattr(form, name))
        self.on_limit.setCurrentIndex(max(0, self.on_limit.findData(form.on_limit)))
        self.share.setCurrentIndex(max(0, self.share.findData(form.share_prefix_cache)))
        self.priority.setCurrentIndex(max(0, self.priority.findData(form.priority)))
        self.kv_share.setText(form.max_kv_share)
        self.models.setText(form.models)

    def form(self) -> PolicyForm:
        f = PolicyForm(on_limit=self.on_limit.currentData() or "",
                       share_prefix_cache=self.share.currentData() or "",
                       priority=self.priority.currentData() or "",
                       max_kv_share=self.kv_share.text(),
                       models=self.models.text())
        for name, edit in self.int_edits.items():
            setattr(f, name, edit.text())
        return f

    def select(self, target: str) -> None:
        """Show the form of `target` (a user name, or DEFAULT), adding it if not listed yet."""
        if self.target.findText(target) < 0:
            self.target.addItem(target)
        self.target.setCurrentText(target)

    def save(self) -> None:
        try:
            body = form_to_policy(self.form(), self.is_default)
        except PolicyError as exc:
            self._error(exc)
            return
        target = self.target.currentText()
        if self.is_default:
            fn = lambda c: c.put_default_policy(body)  # noqa: E731
        else:
            fn = lambda c: c.put_user_policy(target, body)  # noqa: E731
        self.session.call(fn, lambda _p: self._saved(target), self._error)

    def _saved(self, target: str) -> None:
        self.dirty = False
        self.message.setText(f"Saved the policy for {target}; it applies from the next request.")
        self.refresh()

    def clear_override(self) -> None:
        if self.is_default:
            return
        name = self.target.currentText()
        self.session.call(lambda c: c.delete_user_policy(name),
                          lambda _r: self._saved(name), self._error)

    def _error(self, exc: Exception) -> None:
        self.message.setText(f"<span style='color:#a00'>Not saved: {exc}</span>")
