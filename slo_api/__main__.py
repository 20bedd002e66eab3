"""`slo-api` / `python -m slo_api`: serve the app with uvicorn, settings from the environment."""

from __future__ import annotations

import sys

import uvicorn
from pydantic import ValidationError

from slo_api.app import create_app
from slo_api.logs import setup_logging
from slo_api.settings import Settings


def main() -> int:
    try:
        settings = Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']).upper() or 'settings'}: {e['msg']}"
            for e in exc.errors()
        )
        print(f"slo-api: invalid settings: {problems}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, settings.log_format)
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        proxy_headers=True,
        server_header=False,
        timeout_graceful_shutdown=30,
    )
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
