from certeval.runtime.startup import mark

mark("interpreter")  # the first line of certeval that runs: Python itself has started

from .cli import entry  # noqa: E402

entry()
