"""The one error type users see: it says what was wrong and what to do."""


class ResawareError(Exception):
    """Bad input or state, explained in one line; the CLI prints it and exits with code 2."""


def last_line(error: BaseException | str, limit: int = 300) -> str:
    """The last line of an error's text (where native tracebacks put the message), capped; its type if empty."""
    text = str(error).strip()
    if not text:
        return type(error).__name__ if isinstance(error, BaseException) else "no message"
    return text.splitlines()[-1][:limit]
