"""One exception type for every user-facing failure.

The CLI turns a ``QeebmError`` into a single ``error: ...`` line on stderr and exit code 2, so a bad
config key, a malformed corpus line or a missing file never ends in a traceback.
"""


class QeebmError(Exception):
    """A problem with the user's input (config, data, paths), reported as one line."""

    exit_code = 2


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message, or its type's name when the message is empty."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
