"""The admission bound is per model: each served model admits its own --max-num-seqs running
plus --max-waiting-requests queued, so a model at capacity refuses only its own requests;
and a person's recent work on one model lowers their fair-share weight on the others."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from officellm.app.accounts.accounts import Accounts
from officellm.app.admission.admission import AdmissionControl
from officellm.app.db import Database
from officellm.app.errors import APIError
from officellm.app.observability.metrics import ServerMetrics
from officellm.app.observability.refusals import Refusals
from officellm.app.policy import PRIORITY_WEIGHTS
from officellm.app.principal import Principal

RUNNING, WAITING = 1, 1
ALICE, BOB = Principal("alice", 1), Principal("bob", 2)


@pytest.fixture(scope="module")
def accounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Accounts]:
    db = Database(Path(tmp_path_factory.mktemp("admission")) / "officellm.db")
    db.upgrade()
    accounts = Accounts.open(db, owns_db=True)
    yield accounts
    accounts.close()


@pytest.fixture
def control(accounts: Accounts) -> AdmissionControl:
    metrics = ServerMetrics(lambda: [], lambda: None)
    return AdmissionControl(accounts, Refusals(metrics, accounts), RUNNING, WAITING,
                            retry_after_s=1)


async def _fill(control: AdmissionControl, stack: AsyncExitStack, model: str) -> None:
    """Admit RUNNING + WAITING one-sequence requests of different users for `model`."""
    for uid in range(RUNNING + WAITING):
        await stack.enter_async_context(
            control.admit(Principal(f"u{uid}", 100 + uid), "chat", 1, model))


def test_a_model_at_capacity_refuses_only_its_own_requests(control: AdmissionControl) -> None:
    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            await _fill(control, stack, "model-a")
            with pytest.raises(APIError) as refused:
                async with control.admit(ALICE, "chat", 1, "model-a"):
                    pass
            assert refused.value.status == 429 and "`model-a`" in refused.value.message
            async with control.admit(ALICE, "chat", 1, "model-b") as admitted:
                assert admitted.model == "model-b"
                assert control.sequences == {"model-a": RUNNING + WAITING, "model-b": 1}
        assert control.sequences == {}  # every admission gave its sequences back

    asyncio.run(scenario())


def test_a_person_heavy_on_one_model_weighs_less_on_another(control: AdmissionControl) -> None:
    control.cross_model.record(ALICE.user_id, "model-a", 5000)

    async def tags_on(model: str, who: Principal) -> float:
        async with control.admit(who, "chat", 1, model) as admitted:
            return admitted.scheduling.priority

    normal = PRIORITY_WEIGHTS["normal"]
    assert asyncio.run(tags_on("model-b", ALICE)) < normal
    assert asyncio.run(tags_on("model-b", BOB)) == normal
    # On the model they used, their own engine already counts it: the weight stays.
    assert asyncio.run(tags_on("model-a", ALICE)) == normal


def test_without_the_fair_policy_a_weight_stays_as_the_policy_sets_it(
        accounts: Accounts) -> None:
    metrics = ServerMetrics(lambda: [], lambda: None)
    control = AdmissionControl(accounts, Refusals(metrics, accounts), RUNNING, WAITING,
                               retry_after_s=1, share_across_models=False)
    control.cross_model.record(ALICE.user_id, "model-a", 5000)

    async def weight() -> float:
        async with control.admit(ALICE, "chat", 1, "model-b") as admitted:
            return admitted.scheduling.priority

    assert asyncio.run(weight()) == PRIORITY_WEIGHTS["normal"]
