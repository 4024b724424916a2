"""Size limits: how much a MEG may ask of one run, checked before anything starts.

Each limit stands in front of something that would otherwise fail late or never return,
with a traceback or an out-of-memory kill instead of an error naming the field:

- ``MAX_GROUP`` (a node's or an exchange's ``n``): samples per invocation. A chain of
  ``per_sample`` nodes multiplies them, hence also ``MAX_STEP_SAMPLES``.
- ``MAX_ROUNDS`` (an exchange's ``rounds``) and ``MAX_NODES``: an exchange unrolls into
  ``len(agents)·rounds`` nodes, in memory, during validation itself.
- ``MAX_STEP_SAMPLES``: ``episodes_per_step`` × the samples of one episode. The driver
  plans every invocation of a step, the scheduler holds its tasks and the MEG Store one
  segment per node and micro-batch; past a million samples a step, use more steps.
- ``MAX_WINDOW`` (``run.window``, ``--window``): steps compiled ahead into the task graph;
  each is held by the scheduler until it finishes.
- ``MAX_REWARD_PROCESSES`` (``run.scoring.processes``): reward processes per worker.
- ``MAX_DATASET`` (``dataset.train_size``, ``eval_size``): a generator builds the tasks in
  memory before the first step.
- ``MAX_TIMEOUT_S`` (a reward's ``timeout_s``, ``run.scoring.timeout_s``): a day. The wait
  is a ``select`` whose timeout must fit the platform's ``time_t`` (1e300 s raised
  ``OverflowError`` inside the first scoring task).
- ``MAX_SEED`` (``run.seed``, ``dataset.seed``, ``--seed``): 0 to 2³²-1, what every seeded
  generator here accepts (NumPy's legacy seeding stops at 2³²-1, none takes a negative).

``max_tokens`` has no limit here: every rollout engine clamps it to what the model's
context leaves after the prompt.
"""

from __future__ import annotations

MAX_GROUP = 1024
MAX_ROUNDS = 100
MAX_NODES = 1000
MAX_STEP_SAMPLES = 1_000_000
MAX_WINDOW = 64
MAX_REWARD_PROCESSES = 64
MAX_DATASET = 10_000_000
MAX_TIMEOUT_S = 86_400.0
MAX_SEED = 2**32 - 1
