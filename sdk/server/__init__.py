"""The OpenAI-compatible HTTP server: ``build_app(engine, settings)`` returns a FastAPI app.

    from octavo import AsyncLLM
    from octavo.server import build_app
    engine = AsyncLLM(max_model_len=2048)
    app = build_app(engine, engine.settings)   # run with uvicorn; `octavo serve` does all of this
"""

from octavo.server.app import APIError, build_app, error_response

__all__ = ["APIError", "build_app", "error_response"]
