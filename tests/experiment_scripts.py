"""The experiment scripts as modules, for tests that call their `main`, parsers and presets."""

import importlib.util
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def load_script(name):
    """experiments/NAME.py (".py" optional) loaded as a module. experiments/ is on sys.path while it
    loads, as for `python experiments/NAME.py`: the scripts import experiments/_local_data.py."""
    name = name.removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXPERIMENTS))
    return module


# The folder beside the repo that the scripts read (experiments/_local_data.py); tests of the real
# files skip where it is missing.
SHARED_DATA = load_script("_local_data").SHARED_DATA
