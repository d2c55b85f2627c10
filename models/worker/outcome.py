"""What the artist is told when the model worker ends or a message from it cannot be received
(bpy-free): the end of a sentence that starts with "the model process", the line of a crash's
stderr that says what happened, and the one line of a receive failure."""

from __future__ import annotations

from . import protocol as p


def ended_how(returncode: int | None) -> str:
    """How a process ended, as the end of a sentence that starts with "the model process"."""
    if returncode is None:
        return "stopped answering and was ended"
    if returncode == -9:
        return "was killed (out of memory?)"
    if returncode < 0:
        return f"crashed (signal {-returncode})"
    return f"exited with code {returncode}"


def last_line(text: str) -> str:
    """The line of a stderr's end that says what happened (not a traceback's frame lines)."""
    lines = text.splitlines()
    fatal = [line for line in lines if line.startswith("Fatal Python error:")]  # faulthandler's headline
    if fatal:
        return fatal[-1].strip()
    for line in reversed(lines):  # an exception's last line: not indented, not a heading of a stack
        if line.strip() and not line[0].isspace() and not line.startswith(
                ("Traceback", "Current thread", "Thread ", "Extension modules", "<")):
            return line.strip()
    return ""


def receive_failure(exc: BaseException) -> str:
    """A receive failure as the one line a job ends with (the worker is restarted for the next)."""
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == 12):  # ENOMEM
        cause = "this process ran out of memory for the result"
    elif isinstance(exc, FileNotFoundError):
        cause = "its array file or exchange folder was removed"
    elif isinstance(exc, OSError) and exc.errno == 24:
        cause = "this process has too many open files"
    elif isinstance(exc, p.ProtocolError):
        cause = str(exc)
    else:
        cause = f"{type(exc).__name__}: {exc}"
    return f"A result from the model process could not be received ({cause}); the model process was restarted, run it again."
