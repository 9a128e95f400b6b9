"""``python -m elastic_otel.cli``: the ``elastic-otel`` command."""

import sys

from elastic_otel.cli.main import main

sys.exit(main())
