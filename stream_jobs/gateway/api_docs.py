"""The API browser at `/docs`: Swagger UI from files the gateway serves itself.

FastAPI's own `/docs` loads Swagger UI from a CDN, so on a network without the internet
the page stays blank. Here its script, style sheet and favicon come from the
`fastapi-swagger` package (Swagger UI's distribution files, re-released with each Swagger
UI release; only its files are used) under `/docs/assets/`, and the page names them,
and `/openapi.json`, by paths on the gateway: it loads nothing from anywhere else (the
layout FastAPI uses has no online validator badge, which would be an image from
validator.swagger.io). The page is ours, not FastAPI's: it starts Swagger UI from a
script file of the gateway (`static/api-docs.js`), since the gateway's
Content-Security-Policy runs no inline script. ReDoc (`/redoc`) is off: one browser of
the API is enough, and it would be a second bundle to keep current.
"""

from __future__ import annotations

from html import escape
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"
# The files the page loads, by name, with their media types; nothing else is served.
ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
          "favicon-32x32.png": "image/png"}
# Ours: the script that starts Swagger UI.
START_SCRIPT = "api-docs.js"

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="{assets}/swagger-ui.css">
<link rel="icon" href="{assets}/favicon-32x32.png">
<title>{title}</title>
</head>
<body>
<div id="swagger-ui"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script src="{assets}/{start}" data-openapi-url="{openapi}"></script>
</body>
</html>
"""


def mount_api_docs(app: FastAPI) -> None:
    """Serve Swagger UI at `/docs` on `app` (made with `docs_url=None`), for its
    `openapi_url`, with every file it needs."""
    folder = Path(str(files("fastapi_swagger") / "resources"))
    start = Path(str(files("stream_jobs.gateway") / "static" / START_SCRIPT))
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get(DOCS_PATH, include_in_schema=False)
    async def api_docs(request: Request) -> HTMLResponse:
        # Paths, not URLs, so the host is whatever the browser used; prefixed with the
        # ASGI root path, as FastAPI's own /docs does, for an app mounted under one.
        root = str(request.scope.get("root_path", "")).rstrip("/")
        return HTMLResponse(PAGE.format(
            assets=escape(root + ASSETS_PATH), start=START_SCRIPT,
            openapi=escape(root + openapi_url), title=escape(f"{app.title}: API")))

    @app.get(ASSETS_PATH + "/{name}", include_in_schema=False)
    async def api_docs_asset(name: str) -> FileResponse:
        if name == START_SCRIPT:
            return FileResponse(start, media_type="text/javascript")
        media_type = ASSETS.get(name)
        if media_type is None:
            raise HTTPException(404, "Not Found")
        return FileResponse(folder / name, media_type=media_type)


__all__ = ["mount_api_docs"]
