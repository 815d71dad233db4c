"""Exceptions raised by gear_jax. Each names the argument at fault and the fix."""


class GearJaxError(Exception):
    """Base class of every gear_jax error."""


class SpecError(GearJaxError, ValueError):
    """A `Field` or `TableSpec` is invalid."""


class InvalidArgumentError(GearJaxError, ValueError):
    """An argument of an operation has the wrong type, shape, dtype or value."""


class TableClosedError(GearJaxError, RuntimeError):
    """The table was closed; open or attach it again."""


class TableNotFoundError(GearJaxError, FileNotFoundError):
    """No table of that name exists on this host."""


class TableMismatchError(GearJaxError, ValueError):
    """A mapping is not a gear_jax table, or has another spec than the one asked for."""
