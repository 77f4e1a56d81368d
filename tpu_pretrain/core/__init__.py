"""The run core: what a training run is, whatever framework trains it. Imports neither TensorFlow nor JAX.

- ``resolve``: a run's settings completed from its data, its family and model shape (of :mod:`..models`).
- ``protocol``: what the loop needs of a backend's trainer; ``loop``: resume, train, log, evaluate, save, stop.
- ``schedules``: the learning-rate schedules as pure functions, and their re-planning on resume.
- ``metrics``: the one MLM/NSP statistics formula and its means.
- ``checkpoints``, ``mirror``: atomic, verified checkpoints and their background copy.
- ``run_folder``: the contract of a run folder; ``run_lock``, ``session``, ``event_log``, ``status``.
- ``peaks``, ``tpu_targets``: the accelerators' peaks and the TPUs a run can be planned for.
"""
