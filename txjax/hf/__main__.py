"""python -m txjax.hf PATH --text ... | --prompt-ids ...  (see txjax/hf/cli.py)."""

from txjax.hf.cli import main

raise SystemExit(main())
