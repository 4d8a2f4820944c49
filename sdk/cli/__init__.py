"""The ``octavo`` command line: ``main.py`` builds the parser, each subcommand lives in its own module."""
