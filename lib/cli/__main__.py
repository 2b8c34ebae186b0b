"""``python -m lib.cli``: the ``gpuhive`` command."""

from lib.cli import main

raise SystemExit(main())
