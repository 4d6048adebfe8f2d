"""``promptlookup serve``: an OpenAI-compatible HTTP server (FastAPI/uvicorn) over one model.

>>> from promptlookup.server import create_app                      # doctest: +SKIP
>>> app = create_app(promptlookup.load_model())                     # doctest: +SKIP

See :mod:`.app` for the endpoints and policies, :mod:`.worker` for the queue.
"""

from .app import create_app
from .schemas import APIError
from .worker import GenerationWorker

__all__ = ["APIError", "GenerationWorker", "create_app"]
