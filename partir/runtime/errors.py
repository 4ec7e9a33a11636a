"""Errors of the runtime: a program it cannot run, arguments that do not fit the program,
and a mesh larger than the devices JAX can see."""

from __future__ import annotations

from partir.errors import PartitionError


class DeviceCountError(PartitionError):
    """The mesh needs more devices than are available to run the program."""


class ProgramError(PartitionError):
    """The PartIR:HLO program is malformed or uses an op the runtime cannot execute."""


class ArgumentError(PartitionError):
    """The arguments of a call do not match the program's inputs."""
