import sys

from bootseer.cli.main import main

sys.exit(main())
