"""``python -m nbqat ...`` is the same as the ``nbqat`` console script."""

from nbqat.cli import main

raise SystemExit(main())
