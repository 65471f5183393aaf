"""The OpenAPI explorer at /schema/swagger: Swagger UI's files served from
the package (api/swagger/, vendored from the npm package swagger-ui-dist,
version in its VERSION file), so the page works without internet, as the
admin UI does."""
from __future__ import annotations

from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.router import Router
from litestar.static_files import create_static_files_router

from minutehand import packaged

ASSETS = "/schema-assets/swagger"


def plugin() -> SwaggerRenderPlugin:
    return SwaggerRenderPlugin(
        js_url=f"{ASSETS}/swagger-ui-bundle.js", css_url=f"{ASSETS}/swagger-ui.css",
        standalone_preset_js_url=f"{ASSETS}/swagger-ui-standalone-preset.js",
        favicon=f"<link rel='icon' type='image/png' href='{ASSETS}/favicon-32x32.png'>")


def assets() -> Router:
    return create_static_files_router(path=ASSETS, directories=[packaged.folder("minutehand.api", "swagger")],
                                      include_in_schema=False, opt={"public": True})
