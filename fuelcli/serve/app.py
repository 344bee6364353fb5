"""The app (starlette): the route table, auth and error handling around the handlers.

The handlers live by API (openai_api.py, responses_api.py, embeddings_api.py, anthropic_api.py) and take the app's state. Every route
answers errors in its API's shape and never lets an exception reach the server: an unexpected one
becomes a 500 with one line in the log, not a traceback. With an API key set, every route but
/health needs `Authorization: Bearer KEY` or `x-api-key: KEY` (401 otherwise). The paths also
answer without the /v1 prefix, as llama-server's do.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import Route

from . import anthropic_api, embeddings_api, openai_api, responses_api
from .anthropic_format import error_body as anthropic_error
from .errors import APIError
from .jobs import ServedModel
from .request_io import error_response
from .worker import EngineWorker

log = logging.getLogger("fuel.serve")


@dataclass
class AppState:
    """What the handlers share: the model, its engine worker, the API key, whether /metrics is on,
    the responses kept for previous_response_id."""

    model: ServedModel
    worker: EngineWorker
    api_key: str | None = None
    metrics: bool = False
    responses: responses_api.ResponseStore = field(default_factory=responses_api.ResponseStore)


def authorize(state: AppState, request: Request) -> None:
    """The key as `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY` (Anthropic's)."""
    if state.api_key is None:
        return
    key = state.api_key.encode()
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    x_key = request.headers.get("x-api-key")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key):
        return
    if x_key is not None and hmac.compare_digest(x_key.strip().encode(), key):
        return
    raise APIError(401, "Incorrect API key provided." if given or x_key is not None else
                   "You didn't provide an API key: send it as `Authorization: Bearer KEY` or `x-api-key: KEY`.",
                   code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def endpoint(state: AppState, handler, auth: bool = True, error_body=None):
    """handler(state, request) as a route's endpoint: authorized, its errors answered (in OpenAI's
    shape, or error_body's: APIError -> its API's error object)."""

    def failed(e: APIError):
        return error_response(e, None if error_body is None else error_body(e))

    async def handle(request: Request):
        try:
            if auth:
                authorize(state, request)
            return await handler(state, request)
        except APIError as e:
            return failed(e)
        except Exception as e:  # a bug of ours: one line in the log, a 500, no traceback
            log.error("%s %s: %s: %s", request.method, request.url.path, type(e).__name__, e)
            log.debug("the failure in full", exc_info=True)  # only at --log-level debug
            return failed(APIError(500, f"internal error: {type(e).__name__}", type="server_error"))

    return handle


async def http_error(request: Request, exc: HTTPException):
    what = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    e = APIError(exc.status_code, what.get(exc.status_code, str(exc.detail)),
                 code="not_found" if exc.status_code == 404 else None, headers=exc.headers)
    anthropic = request.url.path.removeprefix("/v1").startswith("/messages")
    return error_response(e, anthropic_error(e) if anthropic else None)


def routes(state: AppState) -> list[Route]:
    route = lambda path, handler, method, **kw: Route(path, endpoint(state, handler, **kw), methods=[method])  # noqa: E731
    out = [route("/health", openai_api.health, "GET", auth=False),
           route("/metrics", openai_api.show_metrics, "GET")]
    for prefix in ("/v1", ""):
        out += [
            route(f"{prefix}/models", openai_api.list_models, "GET"),
            route(f"{prefix}/models/{{model_id:path}}", openai_api.get_model, "GET"),
            route(f"{prefix}/chat/completions", openai_api.chat, "POST"),
            route(f"{prefix}/completions", openai_api.completions, "POST"),
            route(f"{prefix}/responses", responses_api.responses, "POST"),
            route(f"{prefix}/embeddings", embeddings_api.embeddings, "POST"),
            route(f"{prefix}/messages", anthropic_api.messages, "POST", error_body=anthropic_error),
            route(f"{prefix}/messages/count_tokens", anthropic_api.count_tokens, "POST", error_body=anthropic_error),
        ]
    return out


def create_app(model: ServedModel, worker: EngineWorker, api_key: str | None = None,
               metrics: bool = False) -> Starlette:
    state = AppState(model, worker, api_key, metrics)
    return Starlette(routes=routes(state), exception_handlers={HTTPException: http_error})
