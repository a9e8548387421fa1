"""The dispatcher's send clock: never early, woken by its timerfd rather than a millisecond of spinning, and
not fooled by a wake-up left from a wait that was interrupted."""

from __future__ import annotations

import gevent

import time

import pytest

from tailgate.load.sendclock import (
    LOOP_TIMER_SPIN_NS,
    SPIN_ENV,
    TIMERFD_ENV,
    TIMERFD_SPIN_MIN_NS,
    TIMERFD_SPIN_NS,
    SendClock,
)

pytestmark = pytest.mark.timing


def _wait_many(clock: SendClock, n: int, spacing_ns: int) -> list[int]:
    """Lateness of ``n`` waits spaced ``spacing_ns`` apart (ns)."""
    late = []
    start = time.perf_counter_ns() + spacing_ns
    for i in range(n):
        when = start + i * spacing_ns
        clock.wait_until(when)
        late.append(time.perf_counter_ns() - when)
    return late


def test_never_returns_before_the_send_time() -> None:
    clock = SendClock()
    try:
        assert clock.kind == "timerfd"  # Linux: the project's platform
        assert clock.spin_ns == TIMERFD_SPIN_NS
        late = _wait_many(clock, 40, 2_000_000)
    finally:
        clock.close()
    assert min(late) >= 0


def test_the_wait_sleeps_in_the_kernel_instead_of_spinning() -> None:
    """Twenty waits of 20 ms each: spinning for them would use the whole 400 ms of CPU; the timerfd's wait
    uses a few microseconds each beside its 100-us spin (a generous 25% of the wall time, for a busy host)."""
    clock = SendClock()
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        _wait_many(clock, 20, 20_000_000)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        clock.close()
    assert wall >= 0.4
    assert cpu < 0.25 * wall, f"{cpu:.3f} s of CPU in {wall:.3f} s of waiting"


def test_a_wake_up_left_by_an_interrupted_wait_does_not_send_early() -> None:
    clock = SendClock()
    try:
        waiter = gevent.spawn(clock.wait_until, time.perf_counter_ns() + 5_000_000)
        gevent.sleep(0.001)
        waiter.kill()  # a cancelled order: the timerfd stays armed and fires with nobody waiting
        gevent.sleep(0.010)
        when = time.perf_counter_ns() + 30_000_000
        clock.wait_until(when)
        assert time.perf_counter_ns() >= when
    finally:
        clock.close()


def test_without_a_timerfd_the_loop_timer_and_the_long_spin_keep_the_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TIMERFD_ENV, "0")
    clock = SendClock()
    try:
        assert clock.kind == "gevent timer"
        assert clock.spin_ns == LOOP_TIMER_SPIN_NS
        late = _wait_many(clock, 10, 3_000_000)
    finally:
        clock.close()
    assert min(late) >= 0


def test_the_spin_follows_how_late_the_wake_ups_come() -> None:
    """Quiet wake-ups shorten the spin to its floor; one late wake-up widens it at once, to twice its lateness
    with a margin, and it narrows again as later wake-ups come on time."""
    clock = SendClock()
    try:
        for _ in range(400):
            clock._follow(2_000)
        assert clock.spin_ns == TIMERFD_SPIN_MIN_NS
        clock._follow(30_000)
        assert clock.spin_ns == 70_000
        clock._follow(500_000)  # a stalled loop: the spin stays bounded
        assert clock.spin_ns == TIMERFD_SPIN_NS
        for _ in range(600):
            clock._follow(2_000)
        assert clock.spin_ns == TIMERFD_SPIN_MIN_NS
    finally:
        clock.close()


def test_real_waits_size_the_spin_and_stay_on_time() -> None:
    """On this host, whatever its load: after a few dozen waits the spin covers what the wake-ups measured,
    and no send goes early."""
    clock = SendClock()
    try:
        late = _wait_many(clock, 60, 2_000_000)
        assert TIMERFD_SPIN_MIN_NS <= clock.spin_ns <= TIMERFD_SPIN_NS
        assert clock.spin_ns >= min(TIMERFD_SPIN_NS, clock.late_peak_ns)
    finally:
        clock.close()
    assert min(late) >= 0


def test_a_fixed_spin_does_not_adapt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SPIN_ENV, "40")
    clock = SendClock()
    try:
        _wait_many(clock, 20, 2_000_000)
        assert clock.spin_ns == 40_000
    finally:
        clock.close()
