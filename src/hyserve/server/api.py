"""The FastAPI application: routes, middleware, error handlers and the engine thread's lifetime."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import JSONResponse, Response

from hyserve import __version__
from hyserve.engine.llm_engine import LLMEngine
from hyserve.server.async_engine import AsyncEngine
from hyserve.server.chat import create_chat_completion
from hyserve.server.completions import create_completion
from hyserve.server.config import ServerConfig
from hyserve.server.direct_routes import DirectRoutes
from hyserve.server.errors import APIError, error_response, install_error_handlers
from hyserve.server.metrics import ServerMetrics
from hyserve.server.middleware import APIKeyMiddleware, BodyLimitMiddleware
from hyserve.server.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList, now_s
from hyserve.server.sampling import load_sampling_defaults
from hyserve.server.serving import ClientGone, ServingContext

CLIENT_CLOSED = 499  # nginx's "client closed request": logged, never seen by the client


def build_app(engine: LLMEngine, config: ServerConfig) -> FastAPI:
    """An app serving ``engine``; the engine thread starts and stops with the app's lifespan."""
    metrics = ServerMetrics(config.model_name)
    async_engine = AsyncEngine(engine, metrics)
    model_dir = Path(engine.args.model)
    defaults = load_sampling_defaults(model_dir) if config.use_generation_config else {}
    ctx = ServingContext(async_engine, config, engine.tokenizer, defaults)
    created = now_s()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async_engine.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            async_engine.stop()

    app = FastAPI(title="hyserve", version=__version__, lifespan=lifespan)
    app.state.ctx = ctx
    app.state.metrics = metrics
    install_error_handlers(app)

    @app.exception_handler(ClientGone)
    async def _gone(_: Request, __: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED)

    def card(name: str) -> ModelCard:
        return ModelCard(id=name, created=created, root=str(model_dir), max_model_len=engine.max_model_len)

    @app.get("/health")
    async def health() -> Response:
        if not async_engine.alive:
            return error_response(503, "the engine is not running")
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": __version__})

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[card(name) for name in config.served_model_names])

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> ModelCard:
        if name not in config.served_model_names:
            raise APIError(404, f"The model `{name}` does not exist.", "model")
        return card(name)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await create_completion(ctx, body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await create_chat_completion(ctx, body, request)

    # innermost of the middleware (added first): the body limit and the API key still apply to the direct routes
    direct = {
        "/v1/completions": (CompletionRequest, create_completion),
        "/v1/chat/completions": (ChatCompletionRequest, create_chat_completion),
    }
    app.add_middleware(DirectRoutes, api=app, context=ctx, routes=direct)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    if config.api_key is not None:
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key)
    return app
