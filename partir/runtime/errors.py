"""Errors of the runtime: arguments that do not fit the program, and a mesh larger than the
devices JAX can see (a program it cannot run is `partir.errors.ProgramError`, which the
interpreters raise too)."""

from __future__ import annotations

from partir.errors import PartitionError


class DeviceCountError(PartitionError):
    """The mesh needs more devices than are available to run the program."""


class ArgumentError(PartitionError):
    """The arguments of a call do not match the program's inputs."""
