"""The training study (SPEC section 9): what each mixer learns on recall, selective copying and a
character-level language model, beside its training speed.

- ``tasks``: ``MQAR`` (Zoology's multi-query associative recall), ``SelectiveCopy`` and
  ``CharLM`` (bytes of the Python standard library's own ``*.py`` files, split by folder, with
  generated files and duplicates left out), all generated on the fly from fixed seeds.
- ``loop``: ``TrainConfig`` (AdamW, warm-up then cosine decay over a fixed number of steps),
  ``train`` and ``evaluate``.
- ``pool``: ``RunPool`` (several runs at once: worker processes, several to a device, over any
  number of GPUs) and the ``Job`` each run is.
- ``resume``: ``FinishedRuns`` (each run's record kept as it finishes, so that a study stopped
  midway goes on where it stopped).
- ``study``: ``Study`` (every task, length, mixer, learning rate of the sweep and seed; Zoology's
  recall curves; a part of the runs), notebook 05's parameters and their ranges, ``run_task``,
  the ``"training"`` result document (schema ``samu.experiment.schema.SCHEMAS["training"]``),
  each mixer at its best learning rate (``learning_rate_choice``) and the yardstick's
  ``sanity``.
- ``figures``, ``conclusion``: drawn and written from a result document; the conclusion compares
  no mixers when attention fails its sanity bar.
- ``cli``: ``make train`` (``python -m samu.experiment.training``) runs notebook 05 with
  ``GPU_PARAMETERS`` on a CUDA device, after ``check_parameters`` has checked every parameter.

Every public name of these modules is importable from here.
"""
from __future__ import annotations

from .parameters import *  # noqa: F401,F403
from .parameters import _check_int, _check_list  # noqa: F401
from .tasks import *  # noqa: F401,F403
from .tasks import _corpus, _distinct, _generator, _split_on  # noqa: F401
from .loop import *  # noqa: F401,F403
from .loop import _synchronize  # noqa: F401
from .pool import *  # noqa: F401,F403
from .resume import *  # noqa: F401,F403
from .study import *  # noqa: F401,F403
from .study import _log_line, _runs  # noqa: F401
from .figures import *  # noqa: F401,F403
from .figures import _seed_range, _title_note  # noqa: F401
from .conclusion import *  # noqa: F401,F403
from .conclusion import _unit  # noqa: F401
from .cli import *  # noqa: F401,F403
from .cli import _device_argument, _time_budget_argument  # noqa: F401
