"""parallel_mlp.bench.timing on the CPU: a hold calls back to back for its time (or its number of
calls) and times every call; settled() leaves out the start of a hold."""

import time

from parallel_mlp.bench.timing import HOLD_SETTLE, hold, hold_steps, settled


def test_hold_calls_back_to_back_and_times_each_call():
    seen = []

    def fn(i):
        seen.append(i)
        time.sleep(0.005 if i % 2 else 0.0)

    t0 = time.monotonic()
    times = hold(fn, 0.1, cuda=False)
    elapsed = time.monotonic() - t0
    assert seen == list(range(len(seen))) and len(times) == len(seen) > 5
    assert 0.1 <= elapsed < 0.2  # stops once its time is up, after the call in flight
    assert min(times[1::2]) >= 4.5 and max(times[0::2]) < 4.5  # each call timed on its own


def test_settled_leaves_out_the_start():
    times = list(range(100))
    assert settled(times) == times[int(100 * HOLD_SETTLE):]
    assert settled([7.0]) == [7.0]  # never empty


def test_hold_steps_makes_exactly_its_calls():
    seen = []

    def fn(i):
        seen.append(i)
        time.sleep(0.003 if i == 2 else 0.0)

    times = hold_steps(fn, 5, cuda=False)
    assert seen == [0, 1, 2, 3, 4] and len(times) == 5
    assert times[2] >= 2.5 and max(times[:2] + times[3:]) < 2.5
    assert hold_steps(fn, 0, cuda=False) == []
