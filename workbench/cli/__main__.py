"""``python -m workbench.cli``: the ``workbench`` command."""

from workbench.cli.commands import main

raise SystemExit(main())
