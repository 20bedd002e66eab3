"""The faults a run injects, each turned off by `--no-NAME`, and the seeded schedule that
guarantees each enabled one occurs in a run however short."""

from __future__ import annotations

import random

# kill: kill -9 of a replica, then its restart on the same port; term: SIGTERM of a replica
# (it drains and exits), then its restart; pause: SIGSTOP of the API server, SIGCONT seconds
# later; compaction: etcd's history compacted (watches get 410 and relist); restart: the API
# server restarted, etcd keeping its data; between one replica and the API server, through
# Toxiproxy (robustness/toxiproxy.py): latency (every answer and event delayed), stall (the
# connections hold, no data passes), reset (connections reset by peer).
NETWORK = ("latency", "stall", "reset")
FAULTS = ("kill", "term", "pause", "compaction", "restart", *NETWORK)

# The pause before each fault when nothing presses: a fault every 8 to 20 s.
GAP = (8.0, 20.0)
# The least pause before a fault, so the traffic between two faults is not nothing.
LEAST_GAP = 2.0


class Schedule:
    """Which fault comes next and after how long: each enabled kind once, in a seeded order,
    with the pauses shrunk so they all fit in the time left, then any kind at random."""

    def __init__(self, rng: random.Random, faults: tuple[str, ...]) -> None:
        self.random = rng
        self.faults = faults
        self.unseen = list(faults)
        rng.shuffle(self.unseen)

    @property
    def complete(self) -> bool:
        """Whether every enabled kind has been chosen."""
        return not self.unseen

    def gap(self, left: float) -> float:
        """The pause before the next fault, `left` seconds before the traffic's end."""
        pause = self.random.uniform(*GAP)
        if self.unseen:
            # Room for the remaining kinds and for each one's own length (a restart takes
            # seconds): spread them evenly over what is left.
            pause = min(pause, max(LEAST_GAP, left / (len(self.unseen) + 1)))
        return pause

    def next(self) -> str:
        if self.unseen:
            return self.unseen.pop(0)
        return self.random.choice(self.faults)
