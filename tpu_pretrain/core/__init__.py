"""The run core: what a training run is, whatever framework trains it. Imports neither TensorFlow nor JAX.

- ``resolve``: a run's settings completed from its data, its family and model shape (of :mod:`..models`), resolved
  once and frozen.
- ``document_masks``: the resolver's decision whether a run keeps the documents of its packed rows apart.
- ``device_decision``: what a run does on the devices its backend found (precision, XLA, steps per call, the eval
  batch), decided with its reasons; the backends' differing policies as data; what to change when a step does not
  fit in memory.
- ``protocol``: what the loop needs of a backend's trainer; ``loop``: resume, train, log, evaluate, save, stop.
- ``run_session``: what one session holds while the loop trains (checkpoints, durable copy, curves, pace, guard,
  save cadence) and what it does at a step's boundary.
- ``overfit``: the passes over the data a run's settings imply, the held-out loss's turn, a perplexity at the end.
- ``schedules``: the learning-rate schedules as pure functions, and their re-planning on resume.
- ``metrics``: the one MLM/NSP statistics formula and its means.
- ``example_ids``: which record of which shard, in which epoch, an example is: one numbering for both backends.
- ``checkpoints``, ``mirror``: atomic, verified checkpoints and their background copy.
- ``mirror_owner``: whose checkpoints a durable copy holds: a run never adopts or prunes another run's.
- ``checkpoint_space``: how many checkpoints fit where, said and checked before the first step.
- ``run_folder``: the contract of a run folder; ``status``: where a run stands (``tpu-pretrain status``).
- ``run_lock``: one training process per run folder (``train.lock``).
- ``session``: the session's deadline and stop signals: stop cleanly, with a last checkpoint.
- ``event_log``: TensorBoard scalars written without TensorFlow.
- ``peaks``, ``tpu_targets``: the accelerators' peaks and the TPUs a run can be planned for.
"""
