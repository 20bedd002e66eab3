"""sloctl: the operator CLI for slo-api.

Commands: ``list``, ``get``, ``set``, ``apply`` and ``reset``; ``sloctl COMMAND --help`` for each.
The server and token come from ``--server``/``--token`` or ``SLO_API_URL``/``SLO_API_TOKEN``.

Exit codes (also in ``sloctl --help``):

== ===========================================================================
0  success
1  server trouble: a 5xx answer, a timeout, a failed connection, an unreadable answer
2  usage error: bad arguments, a bad ``key=value``, a bad file, or a 400 from the API
3  not found (404)
4  conflict: a route claimed by several CRs (409), or still stale after retries (412)
5  unauthorized or forbidden (401/403)
== ===========================================================================
"""
