"""``python -m srtscope``: the ``srtscope`` command."""
from srtscope.cli.app import main

if __name__ == "__main__":
    main()
