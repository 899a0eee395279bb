"""parallel_mlp.bench.timing on the CPU, driven by a fake clock: a hold calls back to back until
its time is up on that clock (or for its number of calls) and times every call; settled() leaves
out the start of a hold; heat() calls every function in turn until its time is up; held_turns
holds functions in alternating turns."""

from fake_clock import FakeClock

from parallel_mlp.bench.timing import HOLD_SETTLE, heat, hold, hold_steps, settled


def test_hold_calls_back_to_back_and_times_each_call():
    clock, seen = FakeClock(), []

    def fn(i):
        seen.append(i)
        clock.advance(2 ** -8 if i % 2 else 2 ** -10)  # 3.90625 ms, 0.9765625 ms

    times = hold(fn, 2 ** -5, cuda=False, clock=clock)  # 31.25 ms
    # Pairs of calls take 4.8828125 ms: after 6 pairs 29.296875 ms have passed, call 12 ends at
    # 30.2734375 and call 13, started before the 31.25 ms were up, at 34.1796875.
    assert seen == list(range(14)) and len(times) == 14
    assert clock() == 35 * 2 ** -10  # stops once its time is up, after the call in flight
    assert times == [1000 * 2 ** -10, 1000 * 2 ** -8] * 7  # each call timed on its own


def test_settled_leaves_out_the_start():
    times = list(range(100))
    assert settled(times) == times[int(100 * HOLD_SETTLE):]
    assert settled([7.0]) == [7.0]  # never empty


def test_hold_steps_makes_exactly_its_calls():
    clock, seen = FakeClock(), []

    def fn(i):
        seen.append(i)
        clock.advance(2 ** -9 if i == 2 else 0.0)

    times = hold_steps(fn, 5, cuda=False, clock=clock)
    assert seen == [0, 1, 2, 3, 4]
    assert times == [0.0, 0.0, 1000 * 2 ** -9, 0.0, 0.0]
    assert hold_steps(fn, 0, cuda=False, clock=clock) == []


def test_heat_calls_every_fn_in_turn_until_its_time_is_up():
    clock, seen = FakeClock(), []
    fns = [lambda i, n=n: (seen.append((n, i)), clock.advance(2 ** -7)) for n in "ab"]
    cycles = heat(fns, 2 ** -5, cuda=False, clock=clock)  # 31.25 ms; a cycle takes 15.625
    # after two cycles the time is up exactly: no third
    assert cycles == 2 and seen == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    # the cycle in flight finishes: 40 ms of time, three cycles of 15.625 ms
    seen.clear()
    assert heat(fns, 0.040, cuda=False, clock=clock) == 3 and len(seen) == 6
    assert heat(fns, 0.0, cuda=False, clock=clock) == 0  # none at all


def test_held_turns_hold_each_fn_in_alternating_order_and_pair_the_rounds(monkeypatch):
    """held_turns: warm-up calls, then per round one hold of each function, forward in even rounds
    and reversed in odd ones; each function's list holds its turns' medians round by round (so
    two functions' turns of one round pair up), and median_ms_held is their medians."""
    import torch

    from parallel_mlp.bench import timing

    order, calls = [], []

    def fake_hold(fn, seconds, **kw):
        fn(0)
        name = calls[-1]
        order.append(name)
        turn = sum(1 for n in order if n == name)  # this function's turn: 1, 2, ...
        # ten calls; the settled ones (after HOLD_SETTLE) read 10 * turn + the function's index
        return [999.0] + [10.0 * turn + "abc".index(name)] * 9

    monkeypatch.setattr(timing, "hold", fake_hold)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    fns = [lambda n=n: calls.append(n) for n in "abc"]
    turns = timing.held_turns(fns, hold_s=0.1, rounds=3, warmup=2)
    assert calls[:6] == list("abcabc")  # the warm-up
    assert order == list("abc" "cba" "abc")
    assert turns == [[10.0, 20.0, 30.0], [11.0, 21.0, 31.0], [12.0, 22.0, 32.0]]
    order.clear()
    assert timing.median_ms_held(fns, hold_s=0.1, rounds=3, warmup=0) == [20.0, 21.0, 22.0]
