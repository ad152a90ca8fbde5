"""The API browser at `/docs`: Swagger UI from files the gateway serves itself.

FastAPI's own `/docs` loads Swagger UI from a CDN, so on a network without the internet
the page stays blank. Here its script, style sheet and favicon come from the
`fastapi-swagger` package (Swagger UI's distribution files, re-released with each Swagger
UI release; only its files are used) under `/docs/assets/`, and the page names them,
and `/openapi.json`, by paths on the gateway: it loads nothing from anywhere else (the
layout FastAPI uses has no online validator badge, which would be an image from
validator.swagger.io). ReDoc (`/redoc`) is off: one browser of the API is enough, and
it would be a second bundle to keep current.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"
# The files the page loads, by name, with their media types; nothing else is served.
ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
          "favicon-32x32.png": "image/png"}


def mount_api_docs(app: FastAPI) -> None:
    """Serve Swagger UI at `/docs` on `app` (made with `docs_url=None`), for its
    `openapi_url`, with every file it needs."""
    folder = Path(str(files("fastapi_swagger") / "resources"))
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get(DOCS_PATH, include_in_schema=False)
    async def api_docs(request: Request) -> HTMLResponse:
        # Paths, not URLs, so the host is whatever the browser used; prefixed with the
        # ASGI root path, as FastAPI's own /docs does, for an app mounted under one.
        root = str(request.scope.get("root_path", "")).rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url, title=f"{app.title}: API",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon-32x32.png")

    @app.get(ASSETS_PATH + "/{name}", include_in_schema=False)
    async def api_docs_asset(name: str) -> FileResponse:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise HTTPException(404, "Not Found")
        return FileResponse(folder / name, media_type=media_type)


__all__ = ["mount_api_docs"]
