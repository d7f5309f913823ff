"""AuthThrottle's window on its own (a settable clock instead of a minute's wait)."""

from __future__ import annotations

import pytest

from officellm.app.admission import auth_throttle
from officellm.app.admission.auth_throttle import AuthThrottle
from officellm.app.errors import APIError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_address_is_let_in_again_once_its_failures_age_out() -> None:
    clock = Clock()
    throttle = AuthThrottle(limit=3, window_s=60, clock=clock)
    for _ in range(3):
        throttle.check("10.0.0.9")
        throttle.failed("10.0.0.9")
        clock.now += 10
    with pytest.raises(APIError) as info:
        throttle.check("10.0.0.9")
    assert info.value.status == 429 and info.value.headers == {"Retry-After": "31"}
    clock.now += 31  # the first failure is now older than the window
    throttle.check("10.0.0.9")


def test_a_zero_limit_never_throttles() -> None:
    throttle = AuthThrottle(limit=0)
    for _ in range(100):
        throttle.failed("10.0.0.9")
    throttle.check("10.0.0.9")


def test_a_sweep_from_many_addresses_keeps_memory_bounded(monkeypatch) -> None:
    monkeypatch.setattr(auth_throttle, "MAX_TRACKED", 100)
    clock = Clock()
    throttle = AuthThrottle(limit=3, clock=clock)
    for i in range(1000):
        clock.now += 0.001
        throttle.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(throttle._failures) == 100
