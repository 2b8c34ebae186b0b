"""``python -m lib``: the ``gpuhive`` command."""

from lib.cli import main

raise SystemExit(main())
