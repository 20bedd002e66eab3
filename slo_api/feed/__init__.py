"""The change feed: one change log, its histories, the open streams and their wire form."""

from __future__ import annotations

from slo_api.feed.core import Closing, Feed
from slo_api.feed.history import VIEWS, Expired
from slo_api.feed.registry import Stream, StreamAccess, TooManyStreams
from slo_api.service import Allowed

__all__ = [
    "VIEWS",
    "Allowed",
    "Closing",
    "Expired",
    "Feed",
    "Stream",
    "StreamAccess",
    "TooManyStreams",
]
