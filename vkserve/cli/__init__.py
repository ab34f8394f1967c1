"""The ``vkserve`` command line: one subcommand per module in ``vkserve.cli.commands``."""
