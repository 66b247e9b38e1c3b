import sys

from resaware.cli.main import main

sys.exit(main())
