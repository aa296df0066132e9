"""The HTTP face of ``rlvr serve``: the ``/api/v1/...`` routes the ``tinker`` SDK (0.38) calls, on Starlette.

Each route reads its body, calls :class:`rlvr.serve.server.Server` and writes JSON (or protobuf where the SDK asks
for it). A route the SDK may call that this server does not serve answers 404 with a message naming the route;
a malformed body answers 400 naming the field.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from rlvr.serve.futures import Result
from rlvr.serve.server import ApiError, Server
from rlvr.serve.wire import PROTO

log = logging.getLogger(__name__)

CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,  # API keys only: any key starting "tml-" (the SDK's own check)
    "parallel_fwdbwd_chunks": False,  # chunks of one forward_backward arrive in order
    "proto_compress_fwdbwd": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,  # forward_backward_custom runs its loss in the client
    "sample_join_sampling_session": False,
}
"""What ``/api/v1/client/config`` tells the SDK (the rest: the SDK's defaults)."""

SERVED = (
    "GET /api/v1/healthz", "GET /api/v1/get_server_capabilities", "POST /api/v1/client/config",
    "POST /api/v1/client/dynamic_config", "POST /api/v1/create_session", "POST /api/v1/session_heartbeat",
    "POST /api/v1/telemetry", "POST /api/v1/create_model", "POST /api/v1/get_info", "POST /api/v1/forward_backward",
    "POST /api/v1/optim_step", "POST /api/v1/save_weights", "POST /api/v1/save_weights_for_sampler",
    "POST /api/v1/load_weights", "POST /api/v1/unload_model", "POST /api/v1/create_sampling_session",
    "POST /api/v1/asample", "POST /api/v1/retrieve_future", "GET /api/v1/samplers/<id>",
    "POST /api/v1/sessions/<id>/finish",
)
"""Every route this server answers (the rest: 404 naming the route)."""


def build_app(server: Server) -> Any:
    """The Starlette application of ``server``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def error(status: int, message: str) -> JSONResponse:
        # a 429 here is the server's model limit, not a rate limit: the SDK would retry it for a minute
        headers = {"x-should-retry": "false"} if status == 429 else None
        return JSONResponse({"error": message, "detail": message}, status_code=status, headers=headers)

    async def json_body(request: Request, route: str) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw or b"{}")
        except ValueError as e:
            raise ApiError(400, f"{route}: the body is not JSON ({e})") from e
        if not isinstance(body, dict):
            raise ApiError(400, f"{route}: the body must be a JSON object")
        return body

    def authorised(request: Request) -> bool:
        key = server.opts.api_key
        if not key:
            return True
        given = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")
        return given == key

    def route(fn, name: str, kind: str = "json"):
        """A handler calling ``fn`` with the JSON body (``json``), the raw body and its encoding (``proto``), or the
        URL's path parameters alone (``path``; a body is ignored)."""

        async def handler(request: Request) -> Response:
            if not authorised(request):
                return error(401, f"{name}: wrong or missing API key (the server was started with --api-key)")
            try:
                if kind == "proto":
                    out = fn(await request.body(), request.headers.get("content-encoding"))
                elif kind == "path":
                    out = fn(**request.path_params)
                else:
                    out = fn(await json_body(request, name))
                if hasattr(out, "__await__"):
                    out = await out
            except ApiError as e:
                return error(e.status, e.message)
            except Exception as e:  # noqa: BLE001 - one request fails, the server goes on
                log.exception("%s failed", name)
                return error(500, f"{name}: {type(e).__name__}: {e}")
            if isinstance(out, Result):
                return result_response(out)
            return JSONResponse(out)

        return handler

    def result_response(res: Result) -> Response:
        if res.error is not None:
            return JSONResponse({"error": res.error, "category": res.category})
        if res.proto:
            return Response(res.value, media_type=PROTO)
        return JSONResponse(res.value)

    async def not_served(request: Request) -> Response:
        what = f"{request.method} {request.url.path}"
        return error(404, f"rlvr serve does not serve {what}; it serves: {', '.join(SERVED)}")

    s = server
    routes = [
        Route("/api/v1/healthz", route(lambda: {"status": "ok"}, "healthz", "path"), methods=["GET"]),
        Route("/api/v1/get_server_capabilities", route(s.capabilities, "get_server_capabilities", "path"), methods=["GET"]),
        Route("/api/v1/client/config", route(lambda b: CLIENT_CONFIG, "client/config"), methods=["POST"]),
        Route("/api/v1/client/dynamic_config", route(lambda b: {}, "client/dynamic_config"), methods=["POST"]),
        Route("/api/v1/create_session", route(s.create_session, "create_session"), methods=["POST"]),
        Route("/api/v1/session_heartbeat", route(s.heartbeat, "session_heartbeat"), methods=["POST"]),
        Route("/api/v1/telemetry", route(lambda b: {"status": "accepted"}, "telemetry"), methods=["POST"]),
        Route("/api/v1/create_model", route(s.create_model, "create_model"), methods=["POST"]),
        Route("/api/v1/get_info", route(s.get_info, "get_info"), methods=["POST"]),
        Route("/api/v1/forward_backward", route(s.forward_backward, "forward_backward", "proto"), methods=["POST"]),
        Route("/api/v1/optim_step", route(s.optim_step, "optim_step"), methods=["POST"]),
        Route("/api/v1/save_weights", route(s.save_weights, "save_weights"), methods=["POST"]),
        Route("/api/v1/save_weights_for_sampler", route(s.save_weights_for_sampler, "save_weights_for_sampler"),
              methods=["POST"]),
        Route("/api/v1/load_weights", route(s.load_weights, "load_weights"), methods=["POST"]),
        Route("/api/v1/unload_model", route(s.unload_model, "unload_model"), methods=["POST"]),
        Route("/api/v1/create_sampling_session", route(s.create_sampling_session, "create_sampling_session"),
              methods=["POST"]),
        Route("/api/v1/asample", route(s.asample, "asample"), methods=["POST"]),
        Route("/api/v1/retrieve_future", route(s.retrieve, "retrieve_future"), methods=["POST"]),
        Route("/api/v1/samplers/{sampler_id}", route(s.get_sampler, "samplers", "path"), methods=["GET"]),
        Route("/api/v1/sessions/{session_id}/finish", route(s.finish_session, "sessions/finish", "path"),
              methods=["POST"]),
        Route("/{path:path}", not_served, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]
    return Starlette(routes=routes)


class Background:
    """A server in this process, behind uvicorn in a daemon thread on ``127.0.0.1:<port>`` (0: a free one): for
    notebooks, scripts and tests that drive it with the SDK. ``url``: its base URL; :meth:`stop` ends it and unloads
    its models. Errors: ``RuntimeError`` when uvicorn has not started within ``start_s`` seconds."""

    def __init__(self, opts: Any, port: int = 0, start_s: float = 30.0) -> None:
        import socket
        import threading
        import time

        import uvicorn

        self.server = Server(opts)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.uv = uvicorn.Server(uvicorn.Config(build_app(self.server), log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.uv.run, kwargs={"sockets": [sock]}, daemon=True, name="uvicorn")
        self.thread.start()
        deadline = time.monotonic() + start_s
        while not self.uv.started:
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"rlvr serve (in the background) did not start within {start_s:.0f}s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.uv.should_exit = True
        self.thread.join(10)
        self.server.close()


def serve(opts: Any) -> None:
    """Run ``rlvr serve`` until interrupted (Ctrl-C / SIGTERM): every model's roles are stopped on the way out."""
    import uvicorn

    server = Server(opts)
    log.info("rlvr serve: %s (from %s) on http://%s:%d, state in %s", server.name, server.model_dir, opts.host,
             opts.port, server.state_dir)
    try:
        uvicorn.run(build_app(server), host=opts.host, port=opts.port, log_level="warning")
    finally:
        server.close()
