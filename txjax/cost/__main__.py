"""`python -m txjax.cost NAME`: print the cost table of a named config (see `txjax.cost.cli`)."""

from txjax.cost.cli import main

main()
