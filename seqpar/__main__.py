"""`python -m seqpar ...`: the `seqpar` command."""

from seqpar.cli.app import main

main()
