"""The user's source line for each traced equation: the first frame outside JAX and partir."""

from __future__ import annotations

import functools
import os
import sysconfig

from jax._src import source_info_util

from partir.ir.location import UNKNOWN_LOCATION, Location

# The `partir` package directory (this file is partir/frontend/source.py), found without
# importing the package, which imports every stage.
_PARTIR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


# Where installed packages live (flax, haiku, ...).
_INSTALLED = tuple(sorted({os.path.abspath(p) + os.sep for key, p in sysconfig.get_paths().items()
                           if key in ("purelib", "platlib")}))


def is_user_file(filename: str) -> bool:
    """Neither JAX's, nor partir's, nor Python's own files."""
    return not filename.startswith("<") and _outside_jax_and_partir(filename)


@functools.cache
def _outside_jax_and_partir(filename: str) -> bool:
    return (source_info_util.is_user_filename(filename)
            and not os.path.abspath(filename).startswith(_PARTIR_DIR))


def user_location(source_info: object) -> Location:
    traceback = getattr(source_info, "traceback", None)
    if traceback is None:
        return UNKNOWN_LOCATION
    loc = _traceback_location(traceback)
    if loc.line and _in_backward(source_info.name_stack):
        return _backward(loc)
    return loc


@functools.lru_cache(maxsize=4096)
def _in_backward(name_stack: source_info_util.NameStack) -> bool:
    """Whether JAX made the equation by transposing (the backward pass of a gradient)."""
    return any(isinstance(e, source_info_util.Transform) and e.name == "transpose"
               for e in name_stack.stack)


@functools.lru_cache(maxsize=4096)
def _backward(loc: Location) -> Location:
    return Location(loc.file, loc.line, loc.function, backward=True)


# Tracebacks hash and compare by their frames' code objects and instructions (in C), and
# the equations of a model's repeated layers are traced from the same call stacks: a
# T32 training step's 11,000 equations have under 200 distinct tracebacks, so each is
# searched once (listing a traceback's frames alone costs ~1 us).
@functools.lru_cache(maxsize=4096)
def _traceback_location(traceback: object) -> Location:
    # Only the frame found is converted (line numbers are worked out from the bytecode):
    # a model's traced equations are thousands.
    code, lasti = traceback.raw_frames()
    for c, i in zip(code, lasti, strict=True):
        if _outside_jax_and_partir(c.co_filename):
            return _location(c, c.co_filename, i)
    return UNKNOWN_LOCATION


# The equations of a model's repeated layers come from a few source lines: each
# (code, instruction) pair is converted once. Locations are immutable, so they are shared.
# Code objects compare equal across files (their file name is not compared): the same
# function in two copies of a module must not share its location, so the key has it.
@functools.lru_cache(maxsize=4096)
def _location(code: object, filename: str, lasti: int) -> Location:
    frame = source_info_util.raw_frame_to_frame(code, lasti)
    return Location(frame.file_name, frame.start_line, frame.function_name)


def model_location(source_info: object) -> Location:
    """The model's line an equation comes from, past the installed libraries it called
    (flax's `nn.with_logical_constraint` binds JAX's annotation in flax's own file); the
    user's location where no frame of the model is found."""
    traceback = getattr(source_info, "traceback", None)
    if traceback is not None:
        for code, lasti in zip(*traceback.raw_frames(), strict=True):
            file = code.co_filename
            if (not file.startswith("<") and _outside_jax_and_partir(file)
                    and not os.path.abspath(file).startswith(_INSTALLED)):
                loc = _location(code, file, lasti)
                return _backward(loc) if _in_backward(source_info.name_stack) else loc
    return user_location(source_info)
