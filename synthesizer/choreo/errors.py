"""User-facing errors: each names the field and the problem, and is shown without a traceback."""


class ChoreoError(Exception):
    """Base of every error choreo reports to a user."""


class InputError(ChoreoError, ValueError):
    """Bad input: a file, field or argument that cannot be used as given."""


class InfeasibleError(ChoreoError):
    """The request is well formed but cannot be satisfied (for example a disconnected tenant)."""
