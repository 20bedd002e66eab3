"""Access: static tokens and Kubernetes identities, decided by one Authorizer."""

from __future__ import annotations

from slo_api.access.authorizer import Allowed, Authorizer, Caller, CallerStream, Held
from slo_api.access.reviews import TtlCache, User

__all__ = ["Allowed", "Authorizer", "Caller", "CallerStream", "Held", "TtlCache", "User"]
