"""`python -m slo_api.openapi [FILE]`: write the app's OpenAPI document as YAML (`make openapi`)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from slo_api.app import create_app
from slo_api.settings import Settings


def render() -> str:
    # The document does not depend on settings; a placeholder token satisfies their validation.
    app = create_app(Settings(slo_api_token="openapi-document-only"))  # noqa: S106
    header = "# Generated from the app by `make openapi`; a test fails when it drifts.\n"
    return header + yaml.safe_dump(app.openapi(), sort_keys=False, allow_unicode=True, width=100)


def main() -> int:
    text = render()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
