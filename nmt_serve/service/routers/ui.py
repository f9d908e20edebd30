"""The attention viewer: a static page (no external assets) that uses the public API only."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

router = APIRouter(include_in_schema=False)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/ui/")


def mount_viewer(app) -> None:
    app.mount("/ui", StaticFiles(directory=STATIC_DIR, html=True), name="ui")
