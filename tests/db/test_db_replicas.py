"""The replicas table (app/db/replicas.py): a replica registers, beats, and is listed as
stale once it has missed its beats; a restart under the same name renews its row."""

from __future__ import annotations

from datetime import timedelta

from officellm.app.db.column_types import utcnow
from officellm.app.db.database import Database
from officellm.app.db.replicas import (
    HEARTBEAT_INTERVAL_S,
    STALE_AFTER_BEATS,
    beat,
    list_replicas,
    register_replica,
)

T0 = utcnow().replace(microsecond=0)


def test_a_registered_replica_is_listed_live_with_its_url(db: Database) -> None:
    with db.transaction() as s:
        register_replica(s, "box-a:8000", "http://box-a:8000", now=T0)
    with db.session() as s:
        (a,) = list_replicas(s, now=T0 + timedelta(seconds=1))
    assert (a.name, a.url, a.model, a.stale, a.draining) == ("box-a:8000", "http://box-a:8000",
                                                            None, False, False)
    assert a.heartbeat_age_s == 1.0


def test_a_replica_that_misses_its_beats_is_stale_and_a_beat_makes_it_live(db: Database) -> None:
    late = timedelta(seconds=HEARTBEAT_INTERVAL_S * STALE_AFTER_BEATS + 1)
    with db.transaction() as s:
        register_replica(s, "box-a:8000", "http://box-a:8000", now=T0)
    with db.session() as s:
        assert list_replicas(s, now=T0 + late)[0].stale
    with db.transaction() as s:
        assert beat(s, "box-a:8000", "Qwen2.5-7B-Instruct", now=T0 + late)
    with db.session() as s:
        (a,) = list_replicas(s, now=T0 + late)
    assert (a.stale, a.model) == (False, "Qwen2.5-7B-Instruct")


def test_a_stopping_replica_says_it_is_draining(db: Database) -> None:
    with db.transaction() as s:
        register_replica(s, "box-a:8000", "http://box-a:8000", now=T0)
        beat(s, "box-a:8000", "m", draining=True, now=T0)
    with db.session() as s:
        assert list_replicas(s, now=T0)[0].draining


def test_a_restart_under_the_same_name_renews_the_row(db: Database) -> None:
    with db.transaction() as s:
        register_replica(s, "box-a:8000", "http://box-a:8000", now=T0)
        beat(s, "box-a:8000", "m", draining=True, now=T0)
    later = T0 + timedelta(hours=1)
    with db.transaction() as s:
        register_replica(s, "box-a:8000", "http://10.0.0.5:8000", now=later)
    with db.session() as s:
        (a,) = list_replicas(s, now=later)
    assert (a.url, a.started, a.draining, a.model) == ("http://10.0.0.5:8000", later, False,
                                                       None)


def test_a_beat_for_a_row_deleted_by_hand_asks_to_register_again(db: Database) -> None:
    with db.transaction() as s:
        assert not beat(s, "gone:8000", "m")
