"""A person's share counted across models (app/policy/cross_model.py), the arithmetic alone."""

from __future__ import annotations

import pytest

from officellm.app.policy.cross_model import MAX_ELSEWHERE, CrossModelService, elsewhere_factor


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_no_work_elsewhere_keeps_the_weight() -> None:
    service = CrossModelService(clock=Clock())
    service.record(1, "a", 1000)
    assert service.factor(1, "a") == 1.0
    assert service.factor(2, "b") == 1.0


def test_the_heavier_elsewhere_gets_the_smaller_factor() -> None:
    service = CrossModelService(clock=Clock())
    service.record(1, "a", 3000)
    service.record(2, "a", 1000)
    assert service.factor(1, "b") < service.factor(2, "b") < 1.0


def test_equal_use_elsewhere_gives_equal_factors() -> None:
    service = CrossModelService(clock=Clock())
    service.record(1, "a", 2000)
    service.record(2, "c", 2000)
    assert service.factor(1, "b") == pytest.approx(service.factor(2, "b"))


def test_the_factor_never_falls_below_its_floor() -> None:
    assert elsewhere_factor(1e12, 1.0) == pytest.approx(1.0 / (1.0 + MAX_ELSEWHERE))


def test_work_elsewhere_is_forgotten_over_half_lives() -> None:
    clock = Clock()
    service = CrossModelService(half_life_s=10.0, clock=clock)
    service.record(1, "a", 1000)
    service.record(2, "b", 1000)
    before = service.factor(1, "b")
    clock.now = 200.0  # twenty half-lives: both users' work has decayed away
    assert before < 1.0 and service.factor(1, "b") == 1.0
