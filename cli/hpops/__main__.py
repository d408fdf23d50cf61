import sys

from hpops.main import main

sys.exit(main())
