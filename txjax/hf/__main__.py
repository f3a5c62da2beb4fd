"""python -m txjax.hf PATH --text ... | --prompt-ids ...  (see txjax/hf/cli.py).

A folder that cannot be read (missing, garbled config.json, tensors that do not fit) is one
line naming it, not a traceback.
"""

import sys

from txjax.hf.cli import main

try:
    raise SystemExit(main())
except (FileNotFoundError, ValueError) as err:  # CheckpointError is a ValueError
    print(f"error: {err}", file=sys.stderr)
    raise SystemExit(1) from None
