"""The user's source line for each traced equation: the first frame outside JAX and partir."""

from __future__ import annotations

import os

from jax._src import source_info_util

import partir
from partir.ir.location import UNKNOWN_LOCATION, Location

_PARTIR_DIR = os.path.dirname(os.path.abspath(partir.__file__)) + os.sep


def is_user_file(filename: str) -> bool:
    """Neither JAX's, nor partir's, nor Python's own files."""
    return (source_info_util.is_user_filename(filename) and not filename.startswith("<")
            and not os.path.abspath(filename).startswith(_PARTIR_DIR))


def user_location(source_info: object) -> Location:
    traceback = getattr(source_info, "traceback", None)
    if traceback is None:
        return UNKNOWN_LOCATION
    for frame in source_info_util.user_frames(traceback):
        if not os.path.abspath(frame.file_name).startswith(_PARTIR_DIR):
            return Location(frame.file_name, frame.start_line, frame.function_name)
    return UNKNOWN_LOCATION
