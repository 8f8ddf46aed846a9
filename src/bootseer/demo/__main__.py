"""``python -m bootseer.demo`` (the README's main command, also ``bootseer demo``)."""

import sys

from bootseer.demo.main import main

if __name__ == "__main__":
    sys.exit(main())
