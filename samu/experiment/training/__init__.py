"""The training study (SPEC section 9): what each mixer learns on recall, selective copying and a
character-level language model, beside its training speed; Zoology's recall curves; and the
study at a scale where a recurrent step is cheaper than attention's.

- ``tasks``: the task table (``TaskSpec`` in ``TASKS``: name, label, metric, data, option
  ranges, whether it counts for the sanity bar) and its tasks, ``MQAR`` (Zoology's multi-query
  associative recall), ``SelectiveCopy`` and ``CharLM`` (bytes of the Python standard library's
  own ``*.py`` files, split by folder), all generated on the fly from fixed seeds.
- ``loop``: ``TrainConfig`` (AdamW, warm-up then cosine decay over a fixed number of steps, or
  warm-up, stable, decay, where a plateau may start the decay), ``train``, ``evaluate`` and
  ``still_learning``.
- ``runs``: one run (``Job``, ``run_job``) and its speed timed alone (``measure_speed``).
- ``pool``: ``RunPool`` (several runs at once: worker processes, several to a device, over any
  number of GPUs).
- ``checkpoint``: ``RunCheckpoint`` (a run's state saved as it trains, so that a run stopped
  midway goes on from its last save).
- ``resume``: ``FinishedRuns`` (each run's record kept as it finishes, so that a study stopped
  midway goes on where it stopped).
- ``study``: ``Study`` (every task, length, mixer, learning rate of the sweep and seed; the
  recall curves; a part of the runs), its parameters and their ranges, ``run_task`` and
  ``run_recall_curves``.
- ``curves``: the recall curves' grid, their table (``recall_curve_frame``) and their own
  sanity bar (``recall_sanity``).
- ``results``: the ``"training"`` result document (schema
  ``samu.experiment.schema.SCHEMAS["training"]``), each mixer at its best learning rate
  (``learning_rate_choice``) and the yardstick's ``sanity``.
- ``configs``: the studies `make train` runs (``CONFIGURATIONS``: the small study, the recall
  curves, the study at scale), each at a GPU's size and a CPU's; ``budget``: a study's device
  time estimated from the committed H200 step times and its FLOP and element counts.
- ``session``: ``StudyRun``, one configuration's study as notebook 05 runs it.
- ``figures``, ``conclusion``: drawn and written from a result document; neither compares
  mixers whose sanity bar failed.
- ``cli``: ``make train`` (``python -m samu.experiment.training``) runs notebook 05 with a
  configuration, after every parameter is checked.

Every public name of these modules is importable from here.
"""
from __future__ import annotations

from .parameters import *  # noqa: F401,F403
from .tasks import *  # noqa: F401,F403
from .loop import *  # noqa: F401,F403
from .checkpoint import *  # noqa: F401,F403
from .runs import *  # noqa: F401,F403
from .pool import *  # noqa: F401,F403
from .resume import *  # noqa: F401,F403
from .results import *  # noqa: F401,F403
from .curves import *  # noqa: F401,F403
from .study import *  # noqa: F401,F403
from .budget import *  # noqa: F401,F403
from .configs import *  # noqa: F401,F403
from .figures import *  # noqa: F401,F403
from .conclusion import *  # noqa: F401,F403
from .session import *  # noqa: F401,F403
from .cli import *  # noqa: F401,F403
