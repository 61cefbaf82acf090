"""The services' ``/docs`` page without a CDN, and the request body of a route that reads its
body itself.

FastAPI's own ``/docs`` loads Swagger UI's script and style from a CDN, so on a cluster without
internet it is blank. :func:`install` serves the page with the assets of the
``swagger-ui-bundle`` package (Swagger UI 4.15, Apache-2.0) from ``/docs/assets/``; the app must
be built with ``docs_url=None, redoc_url=None``.

The routes that take a body read it as bytes (its size and nesting are checked before it is
parsed, serve_apps.errors), so FastAPI cannot see its model: :func:`body` (a route's
``openapi_extra``) and :func:`add_models` state the model's JSON schema and example.
"""

from __future__ import annotations

from typing import Any, Sequence

from fastapi import FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from pydantic import BaseModel

__all__ = ["install", "body", "add_models", "ASSETS"]

# the files the page loads (nothing else in the package is served)
ASSETS = {"swagger-ui-bundle.js": "application/javascript", "swagger-ui.css": "text/css",
          "favicon-32x32.png": "image/png"}


def _assets_dir() -> Any:
    from swagger_ui_bundle import swagger_ui_path

    return swagger_ui_path


def install(api: FastAPI) -> None:
    """``GET /docs`` (Swagger UI on this app's OpenAPI document) and its assets."""
    if api.docs_url is not None:
        raise ValueError("build the app with docs_url=None: apidocs.install serves /docs")

    @api.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + (api.openapi_url or "/openapi.json"), title=f"{api.title} - docs",
            swagger_js_url=f"{root}/docs/assets/swagger-ui-bundle.js",
            swagger_css_url=f"{root}/docs/assets/swagger-ui.css",
            swagger_favicon_url=f"{root}/docs/assets/favicon-32x32.png")

    @api.get("/docs/assets/{name}", include_in_schema=False)
    async def asset(name: str) -> FileResponse:
        if name not in ASSETS:
            raise HTTPException(404, f"no such asset; served: {sorted(ASSETS)}")
        return FileResponse(str(_assets_dir() / name), media_type=ASSETS[name],
                            headers={"cache-control": "max-age=86400"})


def body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads its body itself: ``model`` as its JSON body, with
    the model's first ``examples`` entry as the example (list the model in :func:`add_models`)."""
    content: dict[str, Any] = {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
    examples = (model.model_config.get("json_schema_extra") or {}).get("examples")
    if examples:
        content["example"] = examples[0]
    return {"requestBody": {"required": True, "content": {"application/json": content}}}


def add_models(api: FastAPI, models: Sequence[type[BaseModel]]) -> None:
    """Put ``models``' JSON schemas (and those they use) into ``api``'s OpenAPI components,
    where :func:`body` points."""
    build = api.openapi

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is not None and getattr(api, "_models_added", False):
            return api.openapi_schema
        doc = build()
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        api._models_added = True  # type: ignore[attr-defined]
        return doc

    api.openapi = openapi  # type: ignore[method-assign]
