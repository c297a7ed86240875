"""``python -m refopt`` runs the command-line interface, like the ``refopt`` script."""

from refopt.cli import main

raise SystemExit(main())
