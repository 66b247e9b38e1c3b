"""The one error type users see: it says what was wrong and what to do."""


class ResawareError(Exception):
    """Bad input or state, explained in one line; the CLI prints it and exits with code 2."""
