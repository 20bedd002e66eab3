"""A route's history (see core.py): what a change is (changes.py), who made it
(attribution.py), the RouteRevisions that hold it (revisions.py), and the ConfigMaps of
earlier versions carried over into them (legacy.py)."""

from __future__ import annotations

from slo_api.history.attribution import writer
from slo_api.history.core import History

__all__ = ["History", "writer"]
