"""Ids in paths (a job's, a glossary's: 32 hex digits) as a URL convertor, so that a path that holds none
matches no route (/v1/jobs/file is no job's path, and routing names the methods of the path it is).
"""
from __future__ import annotations

from typing import Annotated

from fastapi import Path
from starlette.convertors import Convertor, register_url_convertor


class HexIdConvertor(Convertor):
    regex = "[0-9a-f]{32}"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("hex_id", HexIdConvertor())


def path_id(what: str):
    """The annotation of an id path parameter (`/jobs/{job_id:hex_id}`)."""
    return Annotated[str, Path(pattern=f"^{HexIdConvertor.regex}$", description=f"the {what}'s id")]
