"""Errors a user can cause: printed by the command line as one line, exit code 2."""


class UserError(Exception):
    """Something the user can fix (missing root, OVS not running, bad flag, port taken).

    The message says what is wrong and what to do, in one line.
    """
