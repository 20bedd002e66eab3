"""The faults a run injects, each turned off by `--no-NAME`."""

from __future__ import annotations

# kill: kill -9 of a replica, then its restart on the same port; pause: SIGSTOP of the API
# server, SIGCONT seconds later; compaction: etcd's history compacted (watches get 410 and
# relist); restart: the API server restarted, etcd keeping its data.
FAULTS = ("kill", "pause", "compaction", "restart")
