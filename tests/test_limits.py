"""The one model-call limiter: a process-wide limit across threads and event loops."""

from __future__ import annotations

import asyncio
import threading

from evalsnap.pipeline.limits import ProcessLimiter


def test_the_limit_holds_across_threads_each_with_its_own_event_loop() -> None:
    limiter = ProcessLimiter(2)
    lock, state = threading.Lock(), {"now": 0, "max": 0}

    async def call() -> None:
        async with limiter.slot():
            with lock:
                state["now"] += 1
                state["max"] = max(state["max"], state["now"])
            await asyncio.sleep(0.01)
            with lock:
                state["now"] -= 1

    async def many() -> None:
        await asyncio.gather(*(call() for _ in range(10)))

    threads = [threading.Thread(target=asyncio.run, args=(many(),)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert state["max"] == 2, f"at most 2 calls in flight, saw {state['max']}"
    assert limiter.in_use == 0, "every slot was given back"


def test_a_cancelled_waiter_loses_no_slot() -> None:
    limiter = ProcessLimiter(1)

    async def main() -> None:
        await limiter.acquire()
        waiter = asyncio.ensure_future(limiter.acquire())
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        limiter.release()
        # the slot is free again: a new holder gets it at once
        await asyncio.wait_for(limiter.acquire(), 1)
        limiter.release()

    asyncio.run(main())
    assert limiter.in_use == 0


def test_a_slot_granted_to_a_waiter_that_is_cancelled_goes_to_the_next() -> None:
    limiter = ProcessLimiter(1)

    async def main() -> None:
        await limiter.acquire()
        first = asyncio.ensure_future(limiter.acquire())
        second = asyncio.ensure_future(limiter.acquire())
        await asyncio.sleep(0.01)
        limiter.release()  # hands the slot to `first` (its wake-up is scheduled)…
        first.cancel()  # …which is cancelled before it runs
        await asyncio.gather(first, return_exceptions=True)
        await asyncio.wait_for(second, 1)  # the slot went on to `second`
        limiter.release()

    asyncio.run(main())
    assert limiter.in_use == 0
