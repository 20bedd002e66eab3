"""Access: static tokens and Kubernetes identities, decided by one Authorizer."""

from __future__ import annotations

from slo_api.access.authorizer import Authorizer, Caller, CallerStream, Held
from slo_api.access.reviews import TtlCache, User
from slo_api.service import Allowed

__all__ = ["Allowed", "Authorizer", "Caller", "CallerStream", "Held", "TtlCache", "User"]
