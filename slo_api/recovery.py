"""How the watch loops wait after a failure, and how they are kept running.

- `Backoff`: capped, jittered exponential backoff (as client-go's reflector: 0.8 s doubling,
  each sleep in [d, 2d)), never over 30 s, and reset by any answer from the API server rather
  than after a healthy stretch: an outage's grown backoff must not be slept again once the API
  server is back.
- `Recovery`: one per process. While loops sleep in their backoff, it asks the API server one
  cheap question (`GET /readyz`) about once a second; when a probe has failed (an outage) and
  one then answers, every sleeper wakes, each after its own jitter under a second so that
  replicas and kinds do not all relist in the same instant. A probe that answers at once means
  the failure was not an outage (RBAC, a bad request): the loops sleep out their backoff, unless
  an outage ended less than 30 s before (a call started during it that failed only after it).
- `supervise`: a long-lived task that fails unexpectedly is logged, counted and started again
  after a backoff, never the silent end of a kind.
- `stop_tasks`: cancel tasks and wait until every one has ended, even one that lost its
  cancellation.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("slo_api.watch")

Sleep = Callable[[float], Awaitable[None]]
Probe = Callable[[], Awaitable[bool]]

PROBE_SECONDS = 1.0
WAKE_JITTER_SECONDS = 1.0
# A loop that fails this soon after an outage ended (a call started during the outage that only
# failed after it, such as a connection attempt into a healed partition) is woken too.
TAIL_SECONDS = 30.0
# A supervised task that ran this long before failing starts over from the first backoff step.
HEALTHY_RUN_SECONDS = 60.0
# A task still running this long after being cancelled is cancelled again.
STOP_RECANCEL_SECONDS = 1.0


@dataclass
class Backoff:
    """Capped exponential backoff with jitter, reset when the API server answers.

    The step doubles from `initial` up to half the cap and each sleep is in [step, 2 * step),
    so sleeps stay spread at the cap and never exceed it.
    """

    initial: float = 0.8
    cap: float = 30.0
    _step: float = 0.0

    def next(self) -> float:
        self._step = min(self.cap / 2, self._step * 2 if self._step else self.initial)
        return self._step * (1 + random.random())

    def reset(self) -> None:
        self._step = 0.0


class Recovery:
    """Wakes the loops asleep in their backoff as soon as the API server answers again.

    `probe` answers True when the API server answers; None turns probing off (each pause is
    a plain sleep). `sleep` is injectable so tests can run on a fake clock.
    """

    def __init__(
        self,
        probe: Probe | None,
        *,
        interval: float = PROBE_SECONDS,
        jitter: float = WAKE_JITTER_SECONDS,
        sleep: Sleep | None = None,
    ) -> None:
        self._probe = probe
        self.interval = interval
        self.jitter = jitter
        self._sleep_override = sleep
        self._sleepers: set[asyncio.Event] = set()
        self._task: asyncio.Task[None] | None = None
        # Outages the probe saw end (sleepers were woken), for tests and the log.
        self.recoveries = 0
        self._recovered_at: float | None = None

    async def _sleep(self, seconds: float) -> None:
        await (self._sleep_override or asyncio.sleep)(seconds)

    async def pause(self, delay: float) -> bool:
        """Sleep `delay` seconds, or less if the API server answers again after an outage.

        True when woken early: the API server answered, so the caller resets its backoff.
        """
        if self._probe is None:
            await self._sleep(delay)
            return False
        woken = asyncio.Event()
        self._sleepers.add(woken)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._watch_outage(), name="watch-recovery-probe"
            )
        timer = asyncio.ensure_future(self._sleep(delay))
        waiter = asyncio.ensure_future(woken.wait())
        try:
            await asyncio.wait({timer, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._sleepers.discard(woken)
            for future in (timer, waiter):
                future.cancel()
        if not woken.is_set():
            return False
        await self._sleep(random.random() * self.jitter)
        return True

    async def _watch_outage(self) -> None:
        """Probe while anyone sleeps; after a failed probe, the first answer wakes them all."""
        assert self._probe is not None
        loop = asyncio.get_running_loop()
        recovered = self._recovered_at
        # Straight after an outage, a failure is still the outage's (see TAIL_SECONDS).
        outage = recovered is not None and loop.time() - recovered < TAIL_SECONDS
        failed = False
        while self._sleepers:
            try:
                answered = await self._probe()
            except Exception:
                # The probe is only a hint: its failure must not end the loops' recovery.
                log.debug("the API server probe failed", exc_info=True)
                answered = False
            if answered:
                if outage:
                    if failed:
                        self.recoveries += 1
                        # Only a real outage opens a tail: failures in the tail do not extend
                        # it (a server whose watches keep failing gets the plain backoff).
                        self._recovered_at = loop.time()
                    log.info(
                        "the API server answers again: waking %d watch loops", len(self._sleepers)
                    )
                    for sleeper in self._sleepers:
                        sleeper.set()
                # Answered at once: not an outage; the sleepers sleep out their backoff.
                return
            outage = failed = True
            await self._sleep(self.interval)

    async def close(self) -> None:
        if self._task is not None:
            await stop_tasks([self._task])
            self._task = None


async def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    *,
    on_failure: Callable[[BaseException | None], None],
    pause: Callable[[float], Awaitable[object]],
) -> None:
    """Run `run()` for ever: an exception or a return (neither is expected) is logged,
    reported to `on_failure` (which counts it) and followed, after a backoff, by a new run."""
    backoff = Backoff()
    loop = asyncio.get_running_loop()
    while True:
        error: BaseException | None = None
        started = loop.time()
        try:
            await run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = exc
        on_failure(error)
        if loop.time() - started > HEALTHY_RUN_SECONDS:
            backoff.reset()
        delay = backoff.next()
        if error is None:
            log.error("%s ended, which it never should; restarting it in %.1fs", name, delay)
        else:
            log.error("%s failed unexpectedly; restarting it in %.1fs", name, delay, exc_info=error)
        await pause(delay)


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and return once every one has ended.

    A cancellation can be lost (asyncio.wait_for on Python 3.11 drops one that races with the
    result), so a task still running after STOP_RECANCEL_SECONDS is cancelled again rather
    than hang the stop. When the caller is cancelled meanwhile, the tasks are still stopped
    first; then the caller's cancellation goes on.
    """
    pending = set(tasks)
    cancelled = False
    while pending:
        for task in pending:
            task.cancel()
        try:
            _, pending = await asyncio.wait(pending, timeout=STOP_RECANCEL_SECONDS)
        except asyncio.CancelledError:
            cancelled = True
            pending = {task for task in pending if not task.done()}
            continue
        for task in pending:
            log.warning("%s did not stop when cancelled; cancelling again", task.get_name())
    if cancelled:
        raise asyncio.CancelledError
