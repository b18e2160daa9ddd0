"""``python -m loadertune``: the command-line interface."""

from loadertune.cli import main

if __name__ == "__main__":
    main()
