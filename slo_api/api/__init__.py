"""The HTTP layer: routers, dependencies, middleware and error handlers."""
