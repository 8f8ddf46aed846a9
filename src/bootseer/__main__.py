import sys

from bootseer.cli.main import main

if __name__ == "__main__":  # a spawned FUSE server imports this module as __mp_main__
    sys.exit(main())
