"""The admin API under /admin/ (docs/admin_api.md): the console's only way in.

Every route needs the admin token (require_admin) and, unless `--admin-remote`, a loopback
client. Routes are plain `def`s: FastAPI runs them on worker threads, so their SQLite reads and
writes never block the event loop.
"""

from fastapi import APIRouter, Depends

from officellm.app.admin import (
    activity,
    audit,
    keys,
    live,
    models,
    policies,
    replicas,
    usage,
    users,
    what_if,
)
from officellm.app.admin.access import require_admin
from officellm.app.openai.answers import ERROR_RESPONSES

router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)],
                   responses=ERROR_RESPONSES)
for _module in (live, what_if, users, keys, policies, activity, usage, replicas, models, audit):
    router.include_router(_module.router)

__all__ = ["router"]
