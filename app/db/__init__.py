"""officellm's SQLite data layer: users, API keys, policies, threads, usage, events, settings.

Open with `Database(path)`, bring the schema up with `.upgrade()`, and call the repository
functions below with a session (`with db.transaction() as s: ...`).
"""

from officellm.app.db.admin_token import ensure_admin_token, reset_admin_token, verify_admin_token
from officellm.app.db.database import Database
from officellm.app.db.errors import AlreadyExists, NotFound
from officellm.app.db.events import recent_events, record_event
from officellm.app.db.install_settings import (
    get_setting,
    set_setting,
)
from officellm.app.db.keys import authenticate, issue_key, list_keys, revoke_key
from officellm.app.db.paths import default_db_path
from officellm.app.db.policies import (
    StoredPolicy,
    clear_policy,
    get_effective_policy,
    get_policy,
    set_policy,
)
from officellm.app.db.records import (
    AuthenticatedUser,
    EventInfo,
    IssuedKey,
    KeyInfo,
    ThreadInfo,
    UsageCounts,
    UsageDay,
    UsageReportRow,
    UserInfo,
)
from officellm.app.db.startup import prepare_database
from officellm.app.db.threads import get_thread_state, list_threads, record_thread
from officellm.app.db.usage import add_usage, list_usage, usage_report, usage_today, utc_today
from officellm.app.db.users import (
    create_user,
    delete_user,
    disable_user,
    ensure_user,
    get_user,
    list_users,
    set_user_disabled,
)

__all__ = [
    "AlreadyExists",
    "AuthenticatedUser",
    "Database",
    "EventInfo",
    "IssuedKey",
    "KeyInfo",
    "NotFound",
    "StoredPolicy",
    "ThreadInfo",
    "UsageCounts",
    "UsageDay",
    "UsageReportRow",
    "UserInfo",
    "add_usage",
    "authenticate",
    "clear_policy",
    "create_user",
    "default_db_path",
    "disable_user",
    "ensure_admin_token",
    "ensure_user",
    "get_effective_policy",
    "get_policy",
    "get_setting",
    "get_thread_state",
    "get_user",
    "issue_key",
    "list_keys",
    "list_threads",
    "list_usage",
    "list_users",
    "prepare_database",
    "recent_events",
    "record_event",
    "record_thread",
    "reset_admin_token",
    "revoke_key",
    "set_policy",
    "set_setting",
    "set_user_disabled",
    "delete_user",
    "usage_report",
    "usage_today",
    "utc_today",
    "verify_admin_token",
]
