"""The dashboard's static files at `/ui/`.

Plain files shipped in the package: no build step on the server and nothing fetched from
elsewhere at run time. The page signs in with a pasted token and calls only the public API,
so it sees exactly what that token may see. The Content-Security-Policy allows scripts and
styles from this origin only (no inline script, no eval), so a value from the API that slipped
past the page's text-only rendering still could not run.
"""

from __future__ import annotations

from importlib import resources
from pathlib import PurePosixPath

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from ..errors import DomainError
from .common import error_response

router = APIRouter(include_in_schema=False)

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
         ".ico": "image/x-icon", ".txt": "text/plain; charset=utf-8"}
ROOT = resources.files("orbit.server") / "ui"


def _asset(path: str) -> tuple[bytes, str] | None:
    """The file at `path` under the dashboard's folder, or None; never anything outside it."""
    parts = PurePosixPath(path or "index.html").parts
    if not parts or any(p in ("", ".", "..") or p.startswith(".") or "\\" in p for p in parts):
        return None
    kind = TYPES.get(PurePosixPath(parts[-1]).suffix)
    if kind is None:
        return None
    entry = ROOT.joinpath(*parts)
    if not entry.is_file():
        return None
    return entry.read_bytes(), kind


@router.api_route("/ui", methods=["GET", "HEAD"])
async def ui_root() -> Response:
    return RedirectResponse("/ui/", status_code=308)


@router.api_route("/ui/{path:path}", methods=["GET", "HEAD"])
async def ui_file(request: Request, path: str) -> Response:
    found = _asset(path)
    if found is None:
        return error_response(request, DomainError("NOT_FOUND", "no such dashboard file"))
    body, kind = found
    return Response(body, media_type=kind, headers=HEADERS)
