"""``promptlookup serve``: an OpenAI-compatible HTTP server (FastAPI/uvicorn) over one model.

>>> from promptlookup.server import Server, ServerSettings, create_app   # doctest: +SKIP
>>> app = create_app(promptlookup.load_model(), ServerSettings(port=8001))  # doctest: +SKIP
>>> Server.for_app(app).run()                                           # doctest: +SKIP

See :mod:`.app` for the endpoints and policies, :mod:`.worker` for the queue, and
docs/server.md for everything the API supports and refuses. Serve the app with :class:`Server`
(uvicorn's, with a graceful shutdown); :class:`ServerSettings` holds every setting, the
options of ``promptlookup serve``.
"""

import importlib

__all__ = ["APIError", "GenerationWorker", "Server", "ServerSettings", "create_app"]
_MODULES = {
    "create_app": ".app",
    "APIError": ".request_base",
    "GenerationWorker": ".worker",
    "Server": ".state",
    "ServerSettings": ".settings",
}


def __getattr__(name: str):
    """Imported on first use, so that `promptlookup --help` does not load FastAPI and torch."""
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULES[name], __name__), name)
