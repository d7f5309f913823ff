"""/admin/replicas: the servers sharing this database (docs/cluster.md), live or stale."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from officellm.app.admin.views import Timestamp
from officellm.app.db.replicas import list_replicas
from officellm.app.serving.state import ServerState

router = APIRouter()


class ReplicaView(BaseModel):
    name: str
    url: str = Field(description="Where the console and the router reach it (--advertise-url).")
    model: str | None = Field(description="The model it serves; null while it loads.")
    started: Timestamp
    heartbeat: Timestamp
    heartbeat_age_s: float
    stale: bool = Field(description="It has missed its heartbeats: stopped, killed or cut off "
                                    "from the database.")
    draining: bool = Field(description="It is stopping: it finishes what it runs, takes "
                                       "nothing new.")
    this: bool = Field(description="The replica answering this request.")


@router.get("/replicas")
def get_replicas(request: Request) -> list[ReplicaView]:
    """Every replica that has started on this database, by name."""
    server: ServerState = request.app.state.server
    me = request.app.state.replica.name
    with server.accounts.db.session() as session:
        return [ReplicaView(**r.to_dict(), this=r.name == me) for r in list_replicas(session)]
