"""A clock for timing tests that moves only when a test says so, so no assertion depends on how
busy the machine is: the functions under test 'take' time by advancing it."""


class FakeClock:
    """Seconds, like time.perf_counter. Advances in binary fractions keep sums exact."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def call_taking(self, seconds: float, log: list | None = None, name: str | None = None):
        """fn(i) that takes ``seconds`` of this clock (and appends ``name`` to ``log``)."""

        def fn(i):
            if log is not None:
                log.append(name)
            self.advance(seconds)

        return fn
