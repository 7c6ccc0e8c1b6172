"""The measuring harness: simulators, replays and the logic of every bench and of the demo.

It may import services (it measures them); nothing but tools/ entry points and tests imports it."""

__all__: list[str] = []
