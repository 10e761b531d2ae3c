"""``python -m evalsnap.cli``: the same entry point as the ``evalsnap`` command."""

from evalsnap.cli import main

main()
