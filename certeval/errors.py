"""The errors every layer raises: the bottom of the layers (docs/architecture.md §2).

``estimators/`` may import this module and nothing else of certeval, so the statistics stay usable alone.
"""


class InputError(ValueError):
    """Bad user input, found before anything starts: the message is one line naming the parameter and echoing
    its value; the command line prints it and exits 2."""
