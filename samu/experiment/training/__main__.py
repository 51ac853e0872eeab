"""``python -m samu.experiment.training`` (`make train`)."""
import sys

from .cli import main

sys.exit(main())
